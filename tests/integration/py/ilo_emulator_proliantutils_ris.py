"""proliantutils drives the vmdeploy iLO emulator's Gen9 profile over RIS (HP RESTful API,
/rest/v1), as an independent client.

Run by tests/integration/tests/ilo_emulator_proliantutils.rs:
    python ilo_emulator_proliantutils_ris.py --ilo 127.0.0.1:PORT --user U --password P \
        --image-base http://127.0.0.1:PORT2/ --cacert CERT.pem

proliantutils asks RIBCL for the product name once, then routes every "Gen9" model through its
RIS client (`proliantutils.ilo.ris.RISOperations`). The script records every request that
client sends and every RIBCL request, and checks that each operation went over /rest/v1 and
none over RIBCL. Every check is an assert on what proliantutils returns or on the emulator's
own state (GET /_emulator/state). Exits non-zero on the first failure.
"""

import argparse
import base64
import json
import ssl
import sys
import urllib.error
import urllib.request

import requests

from proliantutils import exception
from proliantutils.ilo import client
from proliantutils.ilo import ribcl
from proliantutils.ilo import ris

from emulator_admin import expect_raises, fault, state

RIS_CALLS = []
RIBCL_CALLS = []


def record_traffic():
    """Wraps the two transports proliantutils has, so the script can tell which one ran."""
    rest_op = ris.RISOperations._rest_op
    request_ilo = ribcl.RIBCLOperations._request_ilo

    def recording_rest_op(self, operation, suburi, request_headers, request_body):
        RIS_CALLS.append((operation, suburi))
        return rest_op(self, operation, suburi, request_headers, request_body)

    def recording_request_ilo(self, root, extra_headers=None):
        RIBCL_CALLS.append(root)
        return request_ilo(self, root, extra_headers)

    ris.RISOperations._rest_op = recording_rest_op
    ribcl.RIBCLOperations._request_ilo = recording_request_ilo


def over_ris(fn, *a, expect=None):
    """Runs one proliantutils call and checks it went over RIS only: at least one /rest/v1
    request (the `expect` one, if given: (method, path)) and no RIBCL request."""
    ris_before, ribcl_before = len(RIS_CALLS), len(RIBCL_CALLS)
    result = fn(*a)
    sent = RIS_CALLS[ris_before:]
    assert sent, "%s sent no RIS request" % fn.__name__
    assert all(path.startswith("/rest/v1") for _, path in sent), sent
    assert len(RIBCL_CALLS) == ribcl_before, "%s went over RIBCL" % fn.__name__
    if expect is not None:
        assert expect in sent, (expect, sent)
    return result


def raw(args, method, path, body=None, content_type="application/json"):
    """One request of our own to the emulator (Basic auth): (status, JSON body or None)."""
    ctx = ssl.create_default_context(cafile=args.cacert)
    auth = base64.b64encode(("%s:%s" % (args.user, args.password)).encode()).decode()
    headers = {"Authorization": "Basic " + auth}
    data = None
    if body is not None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        if content_type:
            headers["Content-Type"] = content_type
    req = urllib.request.Request("https://%s%s" % (args.ilo, path), data=data,
                                 headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, None


def message_ids(body):
    return [m.get("MessageID") for m in body.get("Messages", [])]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ilo", required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--password", required=True)
    p.add_argument("--image-base", required=True)
    p.add_argument("--cacert", required=True)
    args = p.parse_args()
    iso = args.image_base + "deploy.iso"
    floppy = args.image_base + "params.img"
    record_traffic()

    ilo = client.IloClient(args.ilo, args.user, args.password, timeout=20,
                           port=None, cacert=args.cacert)
    # The model decides the client: a Gen9 gets a RIS object and its calls are routed to it.
    assert ilo.model == "ProLiant DL360 Gen9", ilo.model
    assert isinstance(ilo.ris, ris.RISOperations), type(ilo.ris)
    SYSTEM = "/rest/v1/Systems/1"
    assert over_ris(ilo.get_product_name, expect=("GET", SYSTEM)) == "ProLiant DL360 Gen9"
    assert state(args)["product"] == "ProLiant DL360 Gen9"

    # --- power -----------------------------------------------------------------------------
    assert over_ris(ilo.get_host_power_status) == "OFF"
    over_ris(ilo.set_host_power, "ON", expect=("POST", SYSTEM))
    st = state(args)
    assert st["power"] == "ON" and st["boots"] == 1, st
    assert over_ris(ilo.get_host_power_status) == "ON"
    over_ris(ilo.reset_server, expect=("POST", SYSTEM))
    assert state(args)["boots"] == 2
    over_ris(ilo.hold_pwr_btn, expect=("POST", SYSTEM))
    assert state(args)["power"] == "OFF"
    # iLO 4 refuses a power request for the state the host is in (proliantutils checks first
    # in set_host_power; the raw operation meets the refusal).
    e = expect_raises(exception.IloError, ilo.hold_pwr_btn)
    assert "InvalidOperationForSystemState" in str(e), e
    e = expect_raises(exception.IloError, ilo.ris._perform_power_op, "ForceOff")
    assert "InvalidOperationForSystemState" in str(e), e
    e = expect_raises(exception.IloError, ilo.reset_server)
    assert "InvalidOperationForSystemState" in str(e), e
    over_ris(ilo.set_host_power, "OFF")  # already off: proliantutils does nothing
    over_ris(ilo.press_pwr_btn, expect=("POST", SYSTEM))
    assert state(args)["power"] == "ON"
    over_ris(ilo.set_host_power, "OFF")
    assert state(args)["power"] == "OFF"

    # --- one-time and persistent boot ------------------------------------------------------
    assert over_ris(ilo.get_one_time_boot) == "Normal"
    over_ris(ilo.set_one_time_boot, "NETWORK", expect=("PATCH", SYSTEM))
    assert over_ris(ilo.get_one_time_boot) == "NETWORK"
    assert state(args)["one_time_boot"] == "NETWORK"
    over_ris(ilo.set_host_power, "ON")
    st = state(args)
    assert st["last_boot"]["device"] == "NETWORK" and st["last_boot"]["reason"] == "one_time", st
    assert over_ris(ilo.get_one_time_boot) == "Normal"  # consumed by the boot
    # Legacy mode without a Continuous override: RIS has no legacy order to read.
    assert over_ris(ilo.get_persistent_boot_device) is None
    over_ris(ilo.update_persistent_boot, ["HDD"], expect=("PATCH", SYSTEM))
    assert over_ris(ilo.get_persistent_boot_device) == "HDD"
    assert state(args)["persistent_boot"][0] == "HDD"
    # iLO 4 lists neither SDCard nor UefiHttp, and has no BootSourceOverrideMode.
    status, body = raw(args, "PATCH", SYSTEM, {"Boot": {"BootSourceOverrideTarget": "UefiHttp"}})
    assert status == 400 and message_ids(body) == ["Base.0.10.PropertyValueNotInList"], body
    status, body = raw(args, "PATCH", SYSTEM, {"Boot": {"BootSourceOverrideMode": "UEFI"}})
    assert status == 400 and message_ids(body) == ["Base.0.10.PropertyUnknown"], body
    assert "BootSourceOverrideMode" not in raw(args, "GET", SYSTEM)[1]["Boot"]

    # --- boot mode: pending applies at the next boot -----------------------------------------
    assert over_ris(ilo.get_supported_boot_mode) == "legacy bios and uefi"
    assert over_ris(ilo.get_current_boot_mode) == "LEGACY"
    assert over_ris(ilo.get_pending_boot_mode) == "LEGACY"
    # The current settings are read-only: proliantutils PATCHes their Settings link.
    over_ris(ilo.set_pending_boot_mode, "UEFI",
             expect=("PATCH", "/rest/v1/systems/1/bios/Settings"))
    assert over_ris(ilo.get_pending_boot_mode) == "UEFI"
    assert over_ris(ilo.get_current_boot_mode) == "LEGACY"
    assert state(args)["boot_mode"]["pending"] == "UEFI"
    over_ris(ilo.reset_server)
    assert over_ris(ilo.get_current_boot_mode) == "UEFI"
    assert state(args)["boot_mode"]["current"] == "UEFI"
    bios = ilo.ris._check_bios_resource()[2]
    assert bios["SettingsResult"]["Messages"][0]["MessageID"] == "Base.1.0:Success", bios
    # UEFI persistent order: with the override disabled, proliantutils reads bios/Boot and
    # maps the first entry's BootString back to a device.
    status, _ = raw(args, "PATCH", SYSTEM, {"Boot": {"BootSourceOverrideEnabled": "Disabled"}})
    assert status == 200
    assert over_ris(ilo.get_persistent_boot_device,
                    expect=("GET", "/rest/v1/systems/1/bios/Boot")) == "HDD"
    over_ris(ilo.update_persistent_boot, ["CDROM"])
    assert over_ris(ilo.get_persistent_boot_device) == "CDROM"
    raw(args, "PATCH", SYSTEM, {"Boot": {"BootSourceOverrideEnabled": "Disabled"}})
    assert over_ris(ilo.get_persistent_boot_device) == "CDROM"
    assert state(args)["persistent_boot"][0] == "CDROM"

    # --- secure boot (UEFI only) -------------------------------------------------------------
    assert over_ris(ilo.get_secure_boot_mode) is False
    over_ris(ilo.set_secure_boot_mode, True,
             expect=("PATCH", "/rest/v1/Systems/1/SecureBoot"))
    assert over_ris(ilo.get_secure_boot_mode) is False  # applies at the next boot
    over_ris(ilo.reset_server)
    assert over_ris(ilo.get_secure_boot_mode) is True
    # The same server over Redfish (the Gen9's partial Redfish) sees it.
    status, sb = raw(args, "GET", "/redfish/v1/Systems/1/SecureBoot/")
    assert status == 200 and sb["SecureBootEnable"] is True, sb
    over_ris(ilo.set_pending_boot_mode, "LEGACY")
    over_ris(ilo.reset_server)
    assert over_ris(ilo.get_current_boot_mode) == "LEGACY"
    expect_raises(exception.IloCommandNotSupportedInBiosError, ilo.set_secure_boot_mode, False)
    status, body = raw(args, "PATCH", "/rest/v1/Systems/1/SecureBoot", {"SecureBootEnable": True})
    assert status == 400 and message_ids(body) == ["iLO.0.10.UnsupportedOperationInLegacyBootMode"], body
    over_ris(ilo.set_host_power, "OFF")

    # --- virtual media ---------------------------------------------------------------------
    CD = "/rest/v1/Managers/1/VirtualMedia/2"
    vm = over_ris(ilo.get_vm_status, "CDROM")
    assert vm["IMAGE_INSERTED"] == "NO" and vm["BOOT_OPTION"] == "NO_BOOT", vm
    assert vm["WRITE_PROTECT"] == "YES", vm  # CD default
    assert over_ris(ilo.get_vm_status, "FLOPPY")["WRITE_PROTECT"] == "NO"
    over_ris(ilo.insert_virtual_media, iso, "CDROM", expect=("PATCH", CD))
    vm = over_ris(ilo.get_vm_status, "CDROM")
    assert vm["IMAGE_INSERTED"] == "YES" and vm["IMAGE_URL"] == iso, vm
    assert vm["VM_APPLET"] == "CONNECTED" and vm["BOOT_OPTION"] == "BOOT_ALWAYS", vm
    st = state(args)
    assert st["vmedia"]["CDROM"]["inserted"] is True, st
    assert st["vmedia"]["CDROM"]["image_size"] == 3 * 1024 * 1024, st  # learnt by the range read
    # RIS does not overwrite an inserted image; proliantutils ejects first and succeeds.
    status, body = raw(args, "PATCH", CD, {"Image": floppy})
    assert status == 400 and message_ids(body) == ["iLO.0.10.MediaAlreadyInserted"], body
    over_ris(ilo.insert_virtual_media, iso, "CDROM")
    assert state(args)["vmedia"]["CDROM"]["url"] == iso
    # Inserted/WriteProtected are not writable on iLO 4.
    status, body = raw(args, "PATCH", CD, {"Inserted": False})
    assert status == 400 and message_ids(body) == ["Base.0.10.PropertyUnknown"], body
    over_ris(ilo.set_vm_status, "CDROM", "BOOT_ONCE", "YES", expect=("PATCH", CD))
    # proliantutils looks for BootOnNextServerReset at the top of the resource, where iLO 4
    # does not put it (its own RIS samples have it under Oem.Hp only): it reports BOOT_ALWAYS
    # for a connected medium whatever the flag. The flag itself is under Oem.Hp.
    assert over_ris(ilo.get_vm_status, "CDROM")["BOOT_OPTION"] == "BOOT_ALWAYS"
    assert raw(args, "GET", CD)[1]["Oem"]["Hp"]["BootOnNextServerReset"] is True
    assert state(args)["vmedia"]["CDROM"]["boot_option"] == "BOOT_ONCE"
    # The floppy cannot be a boot device: its slot has no BootOnNextServerReset.
    e = expect_raises(exception.IloError, ilo.set_vm_status, "FLOPPY", "BOOT_ONCE", "YES")
    assert "PropertyUnknown" in str(e), e
    over_ris(ilo.insert_virtual_media, floppy, "FLOPPY")
    fl = over_ris(ilo.get_vm_status, "FLOPPY")
    assert fl["IMAGE_INSERTED"] == "YES" and fl["BOOT_OPTION"] == "BOOT_ALWAYS", fl
    ilo.set_vm_status("CDROM", "CONNECT")  # RIBCL only: proliantutils sends nothing
    over_ris(ilo.update_persistent_boot, ["HDD"])
    over_ris(ilo.set_host_power, "ON")
    st = state(args)
    assert st["last_boot"]["device"] == "CDROM", st
    assert st["last_boot"]["reason"] == "vmedia_boot_once", st
    assert st["last_boot"]["media_url"] == iso, st
    assert st["last_boot"]["media_read_error"] is None, st
    # BOOT_ONCE media are spent by the boot.
    vm = over_ris(ilo.get_vm_status, "CDROM")
    assert vm["IMAGE_INSERTED"] == "NO", vm
    over_ris(ilo.eject_virtual_media, "FLOPPY",
             expect=("PATCH", "/rest/v1/Managers/1/VirtualMedia/1"))
    assert over_ris(ilo.get_vm_status, "FLOPPY")["IMAGE_INSERTED"] == "NO"
    assert state(args)["vmedia"]["FLOPPY"]["inserted"] is False
    over_ris(ilo.eject_virtual_media, "CDROM")  # nothing inserted: no PATCH
    assert RIS_CALLS[-1][0] == "GET", RIS_CALLS[-1]

    # --- licence, firmware -----------------------------------------------------------------
    manager, _ = over_ris(ilo.ris._get_ilo_details, expect=("GET", "/rest/v1/Managers/1"))
    assert manager["Oem"]["Hp"]["License"]["LicenseString"] == "iLO 4 Advanced", manager
    assert state(args)["license"] == "advanced"
    assert over_ris(ilo.ris.get_ilo_firmware_version_as_major_minor) == "2.70"
    over_ris(ilo.activate_license, "XXXXX-XXXXX-XXXXX-XXXXX-XXXXX",
             expect=("POST", "/rest/v1/Managers/1/LicenseService"))

    # --- transport: 301, Content-Type -------------------------------------------------------
    # A trailing slash is redirected (301, absolute Location); the client follows it.
    status, _, system = ilo.ris._rest_get(SYSTEM + "/")
    assert status == 200 and system["Model"] == "ProLiant DL360 Gen9", (status, system)
    r = requests.get("https://%s%s/" % (args.ilo, SYSTEM), auth=(args.user, args.password),
                     verify=args.cacert, allow_redirects=False)
    assert r.status_code == 301 and r.headers["Location"].endswith(SYSTEM), r.headers
    # A body without Content-Type: application/json is refused and changes nothing.
    status, body = raw(args, "PATCH", SYSTEM,
                       '{"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}}',
                       content_type=None)
    assert status == 415 and message_ids(body) == ["Base.0.10.UnsupportedMediaType"], body
    assert state(args)["one_time_boot"] is None

    # --- one state for every protocol -------------------------------------------------------
    ribcl_ops = ribcl.RIBCLOperations(args.ilo, args.user, args.password, timeout=20,
                                      port=None, cacert=args.cacert)
    ribcl_ops.init_model_based_tags(ribcl_ops.get_product_name())
    assert ribcl_ops.get_host_power_status() == "ON"  # powered on over RIS above
    ribcl_ops.hold_pwr_btn()  # off over RIBCL ...
    assert over_ris(ilo.get_host_power_status) == "OFF"  # ... reads OFF over RIS

    # --- faults: the errors proliantutils raises for them -------------------------------------
    fault(args, kind="login_fail", count=1)
    e = expect_raises(exception.IloError, ilo.get_host_power_status)
    assert "NoValidSession" in str(e), e
    fault(args, kind="busy", count=1)
    expect_raises(exception.IloError, ilo.get_product_name)
    assert over_ris(ilo.get_host_power_status) == "OFF"  # faults are spent
    bad = ris.RISOperations(args.ilo, args.user, "wrong", cacert=args.cacert)
    e = expect_raises(exception.IloError, bad.get_host_power_status)
    assert "NoValidSession" in str(e), e

    requests_ris = sum(1 for _ in RIS_CALLS)
    assert requests_ris > 50, requests_ris
    print("proliantutils over RIS: all checks passed (%d RIS requests, %d RIBCL)"
          % (requests_ris, len(RIBCL_CALLS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
