"""Waiting for the rank processes of a Python test."""

import subprocess


def collect(procs, timeout):
    """Wait for every process (stdout piped, stderr merged into it).
    Returns (outputs, failures): one output per process, and a line with
    the output of each that exited non-zero or outlived timeout seconds
    (every process is killed then)."""
    texts, failed = [], []
    for r, p in enumerate(procs):
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            text, _ = p.communicate()
            failed.append("process %d timed out after %d s:\n%s" % (r, timeout, text))
            texts.append(text)
            continue
        texts.append(text)
        if p.returncode != 0:
            failed.append("process %d exited %d:\n%s" % (r, p.returncode, text))
    return texts, failed
