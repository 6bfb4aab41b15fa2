"""The end the test programs share: a module's unittest cases run, and the
counts line ("P passed, F failed, S skipped") that CTest's logs and the GPU
check scripts read.  Returns the exit status: 0 when nothing failed."""

import sys
import unittest


def run_module(name):
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[name])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 0 if failed == 0 else 1
