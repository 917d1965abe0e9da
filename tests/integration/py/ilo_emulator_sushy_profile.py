"""sushy (PyPI) drives the vmdeploy iLO emulator in one firmware profile (docs/ilo-firmware.md),
as Ironic's redfish hardware type would on that iLO: identity, power through the reset window
(sushy retries iLO's InvalidOperationForSystemState itself), the boot override once POST is
over, the read-only override mode, BIOS pending boot mode, and virtual media by the standard
action where the firmware has it and by the HPE OEM action where it has only that.

Run by tests/integration/tests/ilo_emulator_sushy.rs:
    python ilo_emulator_sushy_profile.py --ilo 127.0.0.1:PORT --user U --password P \
        --image-base http://127.0.0.1:PORT2/ --cacert CERT.pem \
        --model MODEL --firmware "iLO 5 v2.72" --quirks q1,q2
"""

import argparse
import sys

import sushy
from sushy import exceptions

from emulator_admin import admin, expect_raises, wait_for_post


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ilo", required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--password", required=True)
    p.add_argument("--image-base", required=True)
    p.add_argument("--cacert", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--firmware", required=True)
    p.add_argument("--quirks", default="")
    args = p.parse_args()
    quirks = set(q for q in args.quirks.split(",") if q)
    iso = args.image_base + "deploy.iso"
    base = "https://%s/redfish/v1/" % args.ilo

    root = sushy.Sushy(base, username=args.user, password=args.password, verify=args.cacert)
    system = root.get_system("/redfish/v1/Systems/1/")
    assert system.model == args.model, system.model
    manager = root.get_manager("/redfish/v1/Managers/1/")
    assert manager.firmware_version == args.firmware, manager.firmware_version
    assert system.power_state == sushy.POWER_STATE_OFF

    # Power on, then a restart at once: inside the reset window iLO answers 400
    # InvalidOperationForSystemState, which sushy retries until the window has passed.
    system.reset_system(sushy.RESET_ON)
    system.reset_system(sushy.RESET_FORCE_RESTART)
    assert admin(args, "/_emulator/state")["boots"] == 2
    system.refresh()
    assert system.power_state == sushy.POWER_STATE_ON

    if "post-refuses-boot-changes" in quirks:
        body = root._conn.get(system.path).json()
        assert body["Oem"]["Hpe"]["PostState"] == "InPost", body["Oem"]["Hpe"]
        e = expect_raises(exceptions.BadRequestError, system.set_system_boot_options,
                          sushy.BOOT_SOURCE_TARGET_CD, enabled=sushy.BOOT_SOURCE_ENABLED_ONCE)
        assert "UnableToModifyDuringSystemPOST" in str(e), e
    wait_for_post(args)
    system.set_system_boot_options(sushy.BOOT_SOURCE_TARGET_CD,
                                   enabled=sushy.BOOT_SOURCE_ENABLED_ONCE)
    system.refresh()
    assert system.boot.target == sushy.BOOT_SOURCE_TARGET_CD, system.boot.target
    if "boot-mode-override-readonly" in quirks:
        e = expect_raises(exceptions.BadRequestError, system.set_system_boot_options,
                          mode=sushy.BOOT_SOURCE_MODE_UEFI)
        assert "UnsupportedOperation" in str(e), e

    # Boot mode through BIOS: pending until the next boot.
    assert system.bios.attributes["BootMode"] == "LegacyBios"
    system.bios.set_attributes({"BootMode": "Uefi"})
    st = admin(args, "/_emulator/state")
    assert st["boot_mode"]["pending"] == "UEFI" and st["boot_mode"]["current"] == "LEGACY", st

    # Virtual media: the standard action, or on firmware without it, the HPE OEM action.
    members = {m.identity: m for m in manager.virtual_media.get_members()}
    cd = members["2"]
    if "vmedia-oem-actions-only" in quirks:
        expect_raises(exceptions.MissingActionError, cd.insert_media, iso)
        oem = cd.json["Oem"]["Hpe"]["Actions"]
        root._conn.post(oem["#HpeiLOVirtualMedia.InsertVirtualMedia"]["target"],
                        data={"Image": iso})
    else:
        cd.insert_media(iso, inserted=True, write_protected=True)
    cd.refresh()
    assert cd.inserted is True and cd.image == iso, (cd.inserted, cd.image)
    root._conn.patch(cd.path, data={"Oem": {"Hpe": {"BootOnNextServerReset": True}}})
    floppy = members["1"]
    if "boot-once-cd-only" in quirks:
        assert "BootOnNextServerReset" not in floppy.json.get("Oem", {}).get("Hpe", {})
        expect_raises(exceptions.BadRequestError, root._conn.patch, floppy.path,
                      data={"Oem": {"Hpe": {"BootOnNextServerReset": True}}})
    system.reset_system(sushy.RESET_FORCE_RESTART)
    st = admin(args, "/_emulator/state")
    assert st["last_boot"]["device"] == "CDROM" and st["last_boot"]["media_url"] == iso, st
    assert st["boot_mode"]["current"] == "UEFI", st
    cd.refresh()
    assert cd.inserted is False  # the boot-once media are spent by the boot
    wait_for_post(args)
    system.reset_system(sushy.RESET_FORCE_OFF)
    system.refresh()
    assert system.power_state == sushy.POWER_STATE_OFF
    print("sushy (%s): all checks passed" % args.firmware)
    return 0


if __name__ == "__main__":
    sys.exit(main())
