"""Completes torch Futures as braid's works finish, without a thread per
call.

One thread at a time, the leader, waits for the works in issue order (the
order braid completes them in). braid_wait drops the GIL (a ctypes call), so
waiting costs the caller nothing. Completing a Future runs its callbacks on
the completing thread, and a callback may wait for a later call of the same
group (PowerSGD's hook does): so the leader hands leadership to an idle
thread before it completes a Future, starting one only where none is idle.
A group needs as many threads as callbacks block at once, plus one.
"""

import queue
import threading


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

    def submit(self, work, fut, finish):
        """When work (anything with wait(), raising on failure) is done, run
        finish() and complete fut with its value, or with the exception
        either raised."""
        self._q.put((work, fut, finish))

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
                item = self._q.get()
                if item is None:
                    self._q.put(None)  # every thread sees the end
                    return
                work, fut, finish = item
                try:
                    work.wait()
                    result, error = finish(), None
                except Exception as e:  # whoever waits on fut gets the error
                    result, error = None, e
                with self._mu:
                    lonely = self._idle == 0
                if lonely:
                    self._spawn()
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)
            with self._mu:
                self._idle += 1
