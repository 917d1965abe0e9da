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


def wait_for_post(args, limit=15.0):
    """Polls `Systems/1` `Oem.Hpe.PostState` (Basic auth) until the host is out of POST: a real
    iLO refuses boot changes meanwhile (UnableToModifyDuringSystemPOST), and the clients under
    test (proliantutils, sushy) do not retry that."""
    import base64
    import time
    ctx = ssl.create_default_context(cafile=args.cacert)
    auth = base64.b64encode(("%s:%s" % (args.user, args.password)).encode()).decode()
    deadline = time.monotonic() + limit
    while True:
        req = urllib.request.Request("https://%s/redfish/v1/Systems/1/" % args.ilo,
                                     headers={"Authorization": "Basic " + auth})
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            post = json.loads(r.read()).get("Oem", {}).get("Hpe", {}).get("PostState")
        if post in (None, "FinishedPost", "PowerOff"):
            return post
        assert time.monotonic() < deadline, "still in POST after %ss: %s" % (limit, post)
        time.sleep(0.2)
