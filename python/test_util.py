"""Runs a test file's unittest cases and writes them to the JUnit XML report Bazel reads
(TIERD_XML), so each case counts, and a skip says why; the training loop the tests share; and a
tierd of a test's own, to kill."""
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import unittest
from xml.sax.saxutils import quoteattr


class _Result(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cases = []

    def startTest(self, test):
        self._start = time.monotonic()
        super().startTest(test)

    def _record(self, test, kind, text=""):
        self.cases.append((test, kind, text, time.monotonic() - self._start))

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "ok")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failure", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "failure", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)


def train_steps(model, opt, batches, loss_of, accumulate=1):
    """The training loop the tests share: `accumulate` micro-batches a step (each loss divided by
    it), opt.step(), opt.zero_grad(); returns each step's summed loss."""
    losses = []
    for i in range(0, len(batches), accumulate):
        total = 0.0
        for batch in batches[i:i + accumulate]:
            loss = loss_of(model, batch) / accumulate
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses


@contextlib.contextmanager
def private_tierd(label):
    """A tierd of the case's own (fake GPU, 16 MiB tiers) at a fresh runtime dir, for a case that
    kills it: yields (the daemon's Popen, the runtime dir); stopped and removed afterwards."""
    scratch = tempfile.mkdtemp(dir=os.environ.get("TIERD_SCRATCH"))
    runtime = tempfile.mkdtemp(prefix=f"/tmp/tierd-py-{label}-")  # short: a socket's path has 107 bytes
    log = open(os.path.join(scratch, "tierd.log"), "w")
    daemon = subprocess.Popen([os.environ["TIERD_BIN"], "--gpu=fake", "--gpu_bytes=16MiB", "--dram_bytes=16MiB",
                               f"--nvme_dir={scratch}", "--nvme_bytes=16MiB", f"--runtime_dir={runtime}"],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(os.path.join(runtime, "tierd.sock")) and time.monotonic() < deadline:
            time.sleep(0.05)
        yield daemon, runtime
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        log.close()
        subprocess.run(["rm", "-rf", runtime])


def main():
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules["__main__"])
    runner = unittest.TextTestRunner(resultclass=_Result, verbosity=2, stream=sys.stdout)
    result = runner.run(suite)
    path = os.environ.get("TIERD_XML")
    if path:
        name = os.path.splitext(os.path.basename(sys.argv[0]))[0]
        with open(path, "w") as f:
            f.write(f'<testsuites><testsuite name="{name}" tests="{len(result.cases)}">\n')
            for test, kind, text, seconds in result.cases:
                result_attr = "skipped" if kind == "skipped" else "completed"
                f.write(f'<testcase name={quoteattr(test.id().split(".")[-1])} classname={quoteattr(name)} '
                        f'time="{seconds:.3f}" result="{result_attr}">')
                if kind == "failure":
                    f.write(f'<failure message={quoteattr(text[-2000:])}/>')
                elif kind == "skipped":
                    f.write(f'<skipped message={quoteattr(text)}/>')
                f.write('</testcase>\n')
            f.write('</testsuite></testsuites>\n')
    sys.exit(0 if result.wasSuccessful() else 1)
