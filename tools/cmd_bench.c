#include <stdio.h>
#include "cli.h"
int cmd_bench(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "not yet\n");
    return 1;
}
