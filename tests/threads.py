"""Test work run in several threads at once: each exception is reported, a hung thread fails."""

import threading


def run_in_threads(work, count, timeout):
    """work(i) for i in range(count), each in its own thread; fails if one raised or is still
    running `timeout` seconds after it was joined."""
    errors = []

    def guarded(i):
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, "a thread raised: %r" % errors
