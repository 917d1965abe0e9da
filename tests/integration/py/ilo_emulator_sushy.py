"""sushy (PyPI) drives the vmdeploy iLO emulator's Redfish side, as an independent client.

Covers power (ComputerSystem.Reset), the boot override (Once / Continuous / mode, iLO 5's target
list: UefiHttp taken, Floppy refused, a Continuous BiosSetup lasting one boot), BIOS boot mode
(current vs pending settings object), virtual media insert/eject with BootOnNextServerReset, and
session authentication (sushy's SessionOrBasicAuth; docs/ilo-management.md §3.1).

Run by tests/integration/tests/ilo_emulator_sushy.rs:
    python ilo_emulator_sushy.py --ilo 127.0.0.1:PORT --user U --password P \
        --image-base http://127.0.0.1:PORT2/ --cacert CERT.pem
"""

import argparse
import ssl
import sys
import urllib.request

import sushy
from sushy import exceptions

from emulator_admin import admin, expect_raises


# BootSourceOverrideTarget@Redfish.AllowableValues of iLO 5 (docs/ilo-management.md §3.3).
ILO5_TARGETS = {"None", "Cd", "Hdd", "Usb", "SDCard", "Utilities", "Diags", "BiosSetup", "Pxe",
                "UefiShell", "UefiHttp", "UefiTarget"}


def check_ilo5_override_targets(args, root, system):
    """iLO 5's override targets as sushy (and so Ironic's redfish driver) sees them; the server
    is on."""
    system.refresh()
    assert {t.value for t in system.get_allowed_system_boot_source_values()} == ILO5_TARGETS, \
        system.boot.allowed_values
    # UefiHttp as Ironic's redfish management sets it: listed, so sushy sends it; the NIC boots.
    system.set_system_boot_options(sushy.BOOT_SOURCE_TARGET_UEFI_HTTP,
                                   enabled=sushy.BOOT_SOURCE_ENABLED_ONCE)
    system.refresh()
    assert system.boot.target == sushy.BOOT_SOURCE_TARGET_UEFI_HTTP, system.boot.target
    system.reset_system(sushy.RESET_FORCE_RESTART)
    assert admin(args, "/_emulator/state")["last_boot"]["device"] == "NETWORK"
    # Floppy is not an iLO 5 target: sushy refuses it from the list, the iLO with a 400.
    expect_raises(exceptions.InvalidParameterValueError, system.set_system_boot_options,
                  sushy.BOOT_SOURCE_TARGET_FLOPPY)
    e = expect_raises(exceptions.BadRequestError, root._conn.patch, system.path,
                      data={"Boot": {"BootSourceOverrideTarget": "Floppy"}})
    assert "PropertyValueNotInList" in str(e), e
    # A persistent BiosSetup (`baremetal node boot device set NODE bios --persistent`) enters
    # setup at the next boot only and leaves the persistent order alone.
    order = admin(args, "/_emulator/state")["persistent_boot"]
    system.set_system_boot_options(sushy.BOOT_SOURCE_TARGET_BIOS_SETUP,
                                   enabled=sushy.BOOT_SOURCE_ENABLED_CONTINUOUS)
    system.refresh()
    assert system.boot.target == sushy.BOOT_SOURCE_TARGET_BIOS_SETUP, system.boot.target
    assert system.boot.enabled == sushy.BOOT_SOURCE_ENABLED_ONCE, system.boot.enabled
    assert admin(args, "/_emulator/state")["persistent_boot"] == order
    system.reset_system(sushy.RESET_FORCE_RESTART)
    assert admin(args, "/_emulator/state")["last_boot"]["device"] == "RBSU"
    system.reset_system(sushy.RESET_FORCE_RESTART)
    st = admin(args, "/_emulator/state")
    assert st["last_boot"]["device"] == order[0] and st["persistent_boot"] == order, st
    system.refresh()
    assert system.boot.enabled == sushy.BOOT_SOURCE_ENABLED_DISABLED, system.boot.enabled


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ilo", required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--password", required=True)
    p.add_argument("--image-base", required=True)
    p.add_argument("--cacert", required=True)
    args = p.parse_args()
    iso = args.image_base + "deploy.iso"
    base = "https://%s/redfish/v1/" % args.ilo

    root = sushy.Sushy(base, username=args.user, password=args.password,
                       verify=args.cacert)
    system = root.get_system("/redfish/v1/Systems/1/")
    assert system.identity == "1"
    assert system.model == "ProLiant DL380p Gen8"
    assert system.power_state == sushy.POWER_STATE_OFF

    # power
    system.reset_system(sushy.RESET_ON)
    system.refresh()
    assert system.power_state == sushy.POWER_STATE_ON
    system.reset_system(sushy.RESET_FORCE_RESTART)
    assert admin(args, "/_emulator/state")["boots"] == 2
    system.reset_system(sushy.RESET_FORCE_OFF)
    system.refresh()
    assert system.power_state == sushy.POWER_STATE_OFF
    assert sushy.RESET_FORCE_RESTART in system.get_allowed_reset_system_values()

    # boot override: Once is consumed by the next boot
    system.set_system_boot_options(sushy.BOOT_SOURCE_TARGET_PXE,
                                   enabled=sushy.BOOT_SOURCE_ENABLED_ONCE)
    system.refresh()
    assert system.boot.target == sushy.BOOT_SOURCE_TARGET_PXE, system.boot.target
    assert system.boot.enabled == sushy.BOOT_SOURCE_ENABLED_ONCE
    assert admin(args, "/_emulator/state")["one_time_boot"] == "NETWORK"
    system.reset_system(sushy.RESET_ON)
    st = admin(args, "/_emulator/state")
    assert st["last_boot"]["device"] == "NETWORK", st
    system.refresh()
    assert system.boot.enabled == sushy.BOOT_SOURCE_ENABLED_DISABLED
    # Continuous heads the persistent order
    system.set_system_boot_options(sushy.BOOT_SOURCE_TARGET_HDD,
                                   enabled=sushy.BOOT_SOURCE_ENABLED_CONTINUOUS)
    system.refresh()
    assert system.boot.enabled == sushy.BOOT_SOURCE_ENABLED_CONTINUOUS
    assert admin(args, "/_emulator/state")["persistent_boot"][0] == "HDD"
    check_ilo5_override_targets(args, root, system)
    system.set_system_boot_options(sushy.BOOT_SOURCE_TARGET_HDD,
                                   enabled=sushy.BOOT_SOURCE_ENABLED_CONTINUOUS)
    # override mode = pending boot mode, applied at the next boot
    system.set_system_boot_options(mode=sushy.BOOT_SOURCE_MODE_UEFI)
    st = admin(args, "/_emulator/state")
    assert st["boot_mode"]["pending"] == "UEFI" and st["boot_mode"]["current"] == "LEGACY", st
    assert system.bios.attributes["BootMode"] == "LegacyBios"
    system.reset_system(sushy.RESET_FORCE_RESTART)
    system.refresh()
    system.bios.refresh()
    assert system.boot.mode == sushy.BOOT_SOURCE_MODE_UEFI
    assert system.bios.attributes["BootMode"] == "Uefi"
    # BIOS settings object (pending) as proliantutils' Redfish path uses it
    system.bios.set_attributes({"BootMode": "LegacyBios"})
    assert admin(args, "/_emulator/state")["boot_mode"]["pending"] == "LEGACY"
    system.reset_system(sushy.RESET_FORCE_OFF)

    # virtual media through the manager
    manager = root.get_manager("/redfish/v1/Managers/1/")
    members = {m.identity: m for m in manager.virtual_media.get_members()}
    cd = members["2"]
    assert sushy.VIRTUAL_MEDIA_CD in cd.media_types
    assert cd.inserted is False
    cd.insert_media(iso, inserted=True, write_protected=True)
    cd.refresh()
    assert cd.inserted is True and cd.image == iso and cd.image_name == "deploy.iso"
    assert cd.connected_via == sushy.CONNECTED_VIA_URI
    st = admin(args, "/_emulator/state")
    assert st["vmedia"]["CDROM"]["inserted"] and st["vmedia"]["CDROM"]["connected"], st
    # inserting over an inserted image is refused; sushy surfaces the HTTP error
    expect_raises(exceptions.HTTPError, cd.insert_media, iso)
    # HPE OEM boot-once, then boot from it
    root._conn.patch(cd.path, data={"Oem": {"Hpe": {"BootOnNextServerReset": True}}})
    assert admin(args, "/_emulator/state")["vmedia"]["CDROM"]["boot_option"] == "BOOT_ONCE"
    system.set_system_boot_options(sushy.BOOT_SOURCE_TARGET_CD,
                                   enabled=sushy.BOOT_SOURCE_ENABLED_ONCE)
    system.reset_system(sushy.RESET_ON)
    st = admin(args, "/_emulator/state")
    assert st["last_boot"]["device"] == "CDROM" and st["last_boot"]["media_url"] == iso, st
    cd.refresh()
    assert cd.inserted is False  # BOOT_ONCE media are spent by the boot
    # insert + eject again
    cd.insert_media(iso)
    cd.eject_media()
    cd.refresh()
    assert cd.inserted is False
    # a URL that does not answer fails the insert
    expect_raises(exceptions.HTTPError, cd.insert_media, args.image_base + "missing.iso")

    # authentication
    expect_raises(exceptions.AccessError,
                  lambda: sushy.Sushy(base, username=args.user, password="wrong",
                                      verify=args.cacert).get_system("/redfish/v1/Systems/1/"))
    # busy = 503 + Retry-After; sushy retries server-side errors, so the call still succeeds
    # once the fault is spent
    admin(args, "/_emulator/faults", {"kind": "busy", "count": 1})
    system.refresh()
    assert admin(args, "/_emulator/state")["faults_pending"] == []
    admin(args, "/_emulator/faults", {"kind": "busy", "count": 50})
    import base64
    import urllib.error
    req = urllib.request.Request(
        base + "Systems/1/",
        headers={"Authorization": "Basic " + base64.b64encode(
            ("%s:%s" % (args.user, args.password)).encode()).decode()})
    try:
        urllib.request.urlopen(req, context=ssl.create_default_context(cafile=args.cacert),
                               timeout=10)
        raise AssertionError("busy fault did not give 503")
    except urllib.error.HTTPError as e:
        assert e.code == 503 and e.headers["Retry-After"] == "5", (e.code, dict(e.headers))
    assert len(admin(args, "/_emulator/faults")["faults_pending"]) == 1
    admin(args, "/_emulator/faults", method="DELETE")
    assert admin(args, "/_emulator/faults")["faults_pending"] == []
    system.refresh()
    print("sushy: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
