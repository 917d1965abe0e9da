"""Helpers the emulator test scripts share: the emulator's admin API and an assertRaises.

The scripts run with this folder as their first sys.path entry, so `import emulator_admin` works.
"""

import json
import ssl
import urllib.request


def admin(args, path, body=None, method=None):
    """Calls the emulator's admin API (`/_emulator/...`) of `args.ilo`, trusting `args.cacert`."""
    ctx = ssl.create_default_context(cafile=args.cacert)
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        "https://%s%s" % (args.ilo, path), data=data,
        headers={"Content-Type": "application/json"},
        method=method or ("GET" if body is None else "POST"))
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        return json.loads(r.read())


def state(args):
    """The emulated server's state."""
    return admin(args, "/_emulator/state")


def fault(args, **spec):
    """Queues a fault (`kind`, `count`, ...) on the emulated server."""
    admin(args, "/_emulator/faults", spec)


def expect_raises(exc_type, fn, *a, **kw):
    """Calls fn and returns the exception of type exc_type it raised; fails if it raised none."""
    try:
        fn(*a, **kw)
    except exc_type as e:
        return e
    raise AssertionError("%s did not raise %s" % (fn.__name__, exc_type.__name__))
