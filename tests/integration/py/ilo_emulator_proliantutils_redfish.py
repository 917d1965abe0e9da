"""proliantutils' iLO 5 path (IloClient on a "Gen10" product -> RedfishOperations over sushy)
drives the vmdeploy iLO emulator's Redfish side, as ironic's `ilo5` hardware type would.

The product name must contain "Gen10" (docs/ilo-management.md §1.7): IloClient sends RIBCL GET_PRODUCT_NAME
first, then uses Redfish (sessions, X-Auth-Token) for everything in SUPPORTED_REDFISH_METHODS;
get_vm_status stays on RIBCL, so this also checks that both protocols see one state.

Run by tests/integration/tests/ilo_emulator_sushy.rs:
    python ilo_emulator_proliantutils_redfish.py --ilo 127.0.0.1:PORT --user U --password P \
        --image-base http://127.0.0.1:PORT2/ --cacert CERT.pem
"""

import argparse
import sys
import urllib.request

from proliantutils import exception
from proliantutils.ilo import client

from emulator_admin import state, wait_for_post


def settled(fn, *a):
    """Calls fn, trying again while the iLO refuses a reset within its window after a power
    change (InvalidOperationForSystemState): proliantutils' HPEConnector does not retry it
    (sushy's own connector does), so its caller has to, as a real iLO 5 2.7x makes it."""
    import time
    for _ in range(20):
        try:
            return fn(*a)
        except exception.IloError as e:
            if "InvalidOperationForSystemState" not in str(e):
                raise
            time.sleep(0.5)
    return fn(*a)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ilo", required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--password", required=True)
    p.add_argument("--image-base", required=True)
    p.add_argument("--cacert", required=True)
    # Accepted for the profile runs; the identity is checked through the model only.
    p.add_argument("--model", default=None)
    p.add_argument("--firmware", default=None)
    p.add_argument("--quirks", default="")
    args = p.parse_args()
    iso = args.image_base + "deploy.iso"

    ilo = client.IloClient(args.ilo, args.user, args.password, timeout=20, port=None,
                           cacert=args.cacert)
    assert "Gen10" in ilo.model, ilo.model

    assert ilo.get_host_power_status() == "OFF"
    ilo.set_host_power("ON")
    assert ilo.get_host_power_status() == "ON"
    settled(ilo.reset_server)
    assert state(args)["boots"] == 2
    if args.model:
        assert ilo.model == args.model, ilo.model
    # A real iLO refuses boot changes during POST; proliantutils does not wait for it.
    wait_for_post(args)

    assert ilo.get_one_time_boot() == "Normal"
    ilo.set_one_time_boot("CDROM")
    assert ilo.get_one_time_boot() == "CDROM"
    assert state(args)["one_time_boot"] == "CDROM"
    # BIOS mode: proliantutils reports no persistent device unless the override is Continuous.
    assert ilo.get_persistent_boot_device() is None
    ilo.update_persistent_boot(["HDD"])
    assert ilo.get_persistent_boot_device() == "HDD"
    assert state(args)["persistent_boot"][0] == "HDD"

    assert ilo.get_current_boot_mode() == "LEGACY"
    assert ilo.get_supported_boot_mode() == "legacy bios and uefi"
    ilo.set_pending_boot_mode("UEFI")
    assert ilo.get_pending_boot_mode() == "UEFI"
    assert ilo.get_current_boot_mode() == "LEGACY"

    ilo.insert_virtual_media(iso, "CDROM")
    vm = ilo.get_vm_status("CDROM")
    assert vm["IMAGE_INSERTED"] == "YES" and vm["IMAGE_URL"] == iso, vm
    assert vm["VM_APPLET"] == "CONNECTED", vm
    ilo.set_vm_status("CDROM", "BOOT_ONCE", "YES")
    assert ilo.get_vm_status("CDROM")["BOOT_OPTION"] == "BOOT_ONCE"
    ilo.set_one_time_boot("CDROM")
    settled(ilo.reset_server)
    wait_for_post(args)
    st = state(args)
    assert st["boot_mode"]["current"] == "UEFI", st
    assert st["last_boot"]["device"] == "CDROM" and st["last_boot"]["media_url"] == iso, st
    assert ilo.get_vm_status("CDROM")["IMAGE_INSERTED"] == "NO"  # BOOT_ONCE spent
    # UEFI and no Continuous override: proliantutils reads the HPE bios/boot resource
    # (PersistentBootConfigOrder + BootSources) -- HDD heads the order set above.
    assert ilo.get_persistent_boot_device() == "HDD"
    ilo.insert_virtual_media(iso, "CDROM")
    ilo.eject_virtual_media("CDROM")
    assert ilo.get_vm_status("CDROM")["IMAGE_INSERTED"] == "NO"

    ilo.hold_pwr_btn()
    assert ilo.get_host_power_status() == "OFF"
    # (proliantutils keeps get_vm_status on RIBCL even for Gen10: both protocols share the
    # server's state, as on a real iLO 5 with RIBCL enabled.)
    print("proliantutils (Redfish): all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
