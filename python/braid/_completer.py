"""Completing torch Futures as braid's works finish, without a thread per
call.

A Pending is one braid work, the Future it completes and a finish step
(copying results out). Whoever needs it first settles it: a thread that
waits for the call does the waiting itself (no hand-over between threads
on the path of a blocking call), and the group's Completer settles those
whose Future was asked for (DDP's reducer, then() chains).

One Completer thread at a time, the leader, waits for works. braid_wait
drops the GIL (a ctypes call), so waiting costs the caller nothing.
Completing a Future runs its callbacks on the completing thread, and a
callback may wait for a later call of the same group (PowerSGD's hook
does): so the leader hands leadership to an idle thread before it completes
a Future, starting one only where none is idle. A group needs as many
threads as callbacks block at once, plus one.
"""

import queue
import threading


class Pending:
    """work: has wait() (raising on failure) and is_completed(); fut: has
    set_result and set_exception; finish() gives the result once work is
    done."""

    __slots__ = ("work", "fut", "finish", "_lock", "_taken")

    def __init__(self, work, fut, finish):
        self.work, self.fut, self.finish = work, fut, finish
        self._lock = threading.Lock()
        self._taken = False

    def collect(self):
        """Wait for the work and run finish, once: returns (result, error),
        or None where another thread took it."""
        with self._lock:
            if self._taken:
                return None
            self._taken = True
            try:
                self.work.wait()
                return self.finish(), None
            except Exception as e:  # whoever waits on fut gets the error
                return None, e

    def publish(self, outcome):
        if outcome is None:
            return
        result, error = outcome
        if error is not None:
            self.fut.set_exception(error)
        else:
            self.fut.set_result(result)

    def settle(self):
        """Wait for it here (the caller's thread) and complete its Future."""
        self.publish(self.collect())

    def settle_if_done(self):
        """Settle it when its work has finished; True once it is settled or
        another thread is settling it."""
        if not self._lock.acquire(blocking=False):
            return True  # taken: another thread waits for the work
        try:
            if self._taken:
                return True
            if not self.work.is_completed():
                return False
        finally:
            self._lock.release()
        self.settle()
        return True


class Completer:
    def __init__(self, name):
        self._name = name
        self._q = queue.SimpleQueue()
        self._leader = threading.Lock()
        self._mu = threading.Lock()
        self._idle = 0  # threads waiting to lead
        self._threads = []
        self._spawn()

    def _spawn(self):
        t = threading.Thread(target=self._run, name="%s-%d" % (self._name, len(self._threads)), daemon=True)
        self._threads.append(t)
        with self._mu:
            self._idle += 1
        t.start()

    def submit(self, pending):
        """Settle pending (a Pending) once its work is done, unless a
        waiter does it first."""
        self._q.put(pending)

    def stop(self):
        """End the threads once every work submitted so far is done."""
        self._q.put(None)
        i = 0
        while i < len(self._threads):  # a leader may start one more meanwhile
            if self._threads[i] is not threading.current_thread():
                self._threads[i].join()
            i += 1

    def _run(self):
        while True:
            with self._leader:
                with self._mu:
                    self._idle -= 1
                pending = self._q.get()
                if pending is None:
                    self._q.put(None)  # every thread sees the end
                    return
                outcome = pending.collect()
                with self._mu:
                    lonely = self._idle == 0
                if lonely and outcome is not None:
                    self._spawn()
            pending.publish(outcome)
            with self._mu:
                self._idle += 1
