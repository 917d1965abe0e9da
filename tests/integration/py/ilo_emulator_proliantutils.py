"""proliantutils (PyPI) drives the vmdeploy iLO emulator over RIBCL, as an independent client.

Run by tests/integration/tests/ilo_emulator_proliantutils.rs:
    python ilo_emulator_proliantutils.py --ilo 127.0.0.1:PORT --user U --password P \
        --image-base http://127.0.0.1:PORT2/ --cacert CERT.pem

Every check is an assert on what proliantutils returns (the answers a real iLO 4 gives, see
docs/ilo-management.md §1.5) or on the emulator's own state (GET /_emulator/state).
Exits non-zero on the first failure.
"""

import argparse
import sys
import urllib.request

from proliantutils import exception
from proliantutils.ilo import client
from proliantutils.ilo import ribcl

from emulator_admin import expect_raises, fault, state


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ilo", required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--password", required=True)
    p.add_argument("--image-base", required=True)
    p.add_argument("--cacert", required=True)
    # The firmware the emulator's profile reports (`lab`: 2.55; `ilo4-gen8-ribcl`: 2.10).
    p.add_argument("--firmware", default="2.55")
    # The profile's quirk: a UEFI order lists the virtual CD only while media is connected.
    p.add_argument("--uefi-cd-entry-when-connected", action="store_true")
    args = p.parse_args()
    iso = args.image_base + "deploy.iso"
    floppy = args.image_base + "params.img"

    # IloClient: host "ip:port" with port=None (the /xmldata path ignores the port; §5.2).
    # cacert: TLS verified against the emulator's self-signed certificate (SAN = 127.0.0.1).
    ilo = client.IloClient(args.ilo, args.user, args.password, timeout=20,
                           port=None, cacert=args.cacert)
    assert ilo.model == "ProLiant DL380p Gen8", ilo.model
    assert ilo.get_product_name() == "ProLiant DL380p Gen8"

    # --- power -----------------------------------------------------------------------------
    assert ilo.get_host_power_status() == "OFF"
    assert ilo.hold_pwr_btn() == "Host power is already OFF."
    expect_raises(exception.IloError, ilo.reset_server)  # reset when off fails
    ilo.set_host_power("ON")
    assert ilo.get_host_power_status() == "ON"
    assert state(args)["boots"] == 1
    assert ilo.reset_server() == "Server being reset."
    assert state(args)["boots"] == 2
    ilo.hold_pwr_btn()
    assert ilo.get_host_power_status() == "OFF"
    ilo.press_pwr_btn()
    assert ilo.get_host_power_status() == "ON"
    ilo.set_host_power("OFF")
    assert ilo.get_host_power_status() == "OFF"
    # The RIBCL layer returns iLO's informational message for a no-op.
    r = ribcl.RIBCLOperations(args.ilo, args.user, args.password, timeout=20, port=None,
                              cacert=args.cacert)
    r.init_model_based_tags(r.get_product_name())
    assert r.set_host_power("OFF") == "Host power is already OFF."

    # --- one-time and persistent boot ------------------------------------------------------
    assert ilo.get_one_time_boot() == "Normal"
    ilo.set_one_time_boot("NETWORK")
    assert ilo.get_one_time_boot() == "NETWORK"
    assert state(args)["one_time_boot"] == "NETWORK"
    ilo.set_host_power("ON")
    st = state(args)
    assert st["last_boot"]["device"] == "NETWORK" and st["last_boot"]["reason"] == "one_time", st
    assert ilo.get_one_time_boot() == "Normal"  # consumed by the boot
    ilo.set_host_power("OFF")
    assert ilo.get_persistent_boot_device() == "CDROM"  # fresh legacy order: CD first
    ilo.update_persistent_boot(["HDD"])
    assert ilo.get_persistent_boot_device() == "HDD"
    assert state(args)["persistent_boot"][0] == "HDD"
    ilo.update_persistent_boot(["NETWORK"])
    assert ilo.get_persistent_boot_device() == "NETWORK"

    # --- boot mode: pending applies at the next power-on -------------------------------------
    assert ilo.get_supported_boot_mode() == "legacy bios and uefi"
    assert ilo.get_current_boot_mode() == "LEGACY"
    assert ilo.get_pending_boot_mode() == "LEGACY"
    ilo.set_pending_boot_mode("UEFI")
    assert ilo.get_pending_boot_mode() == "UEFI"
    assert ilo.get_current_boot_mode() == "LEGACY"
    ilo.set_host_power("ON")
    assert ilo.get_current_boot_mode() == "UEFI"
    # UEFI persistent boot: BootXXXX ids with descriptions, mapped back by proliantutils.
    assert ilo.get_persistent_boot_device() == "NETWORK"
    # As a real iLO 4 lists them: one NIC entry per IP version, descriptions wrapped over lines.
    entries = ilo.ribcl._get_persistent_boot()
    nics = [e["value"] for e in entries if "NIC" in e["DESCRIPTION"]]
    assert nics == ["Boot0009", "Boot0008"], entries
    # The wrapped line reaches the client as a run of spaces (XML attribute normalisation).
    assert any("    " in e["DESCRIPTION"] for e in entries), entries
    ilo.update_persistent_boot(["NETWORK"])
    assert ilo.get_persistent_boot_device() == "NETWORK"
    assert state(args)["persistent_boot"][0] == "NETWORK"
    ilo.update_persistent_boot(["HDD"])
    assert ilo.get_persistent_boot_device() == "HDD"
    if args.uefi_cd_entry_when_connected:
        # proliantutils meets the real iLO 4's missing entry (its sample
        # GET_PERSISTENT_BOOT_DEVICE_CDROM_MISSING_UEFI_XML) and refuses; with the CD
        # inserted and connected, as Ironic's attach does, the entry is there.
        try:
            ilo.update_persistent_boot(["CDROM"])
            raise AssertionError("the CD entry is listed without media")
        except exception.IloInvalidInputError as e:
            assert "CDROM" in str(e), e
        ilo.insert_virtual_media(iso, device="CDROM")
        ilo.set_vm_status(device="CDROM", boot_option="CONNECT", write_protect="YES")
    ilo.update_persistent_boot(["CDROM"])
    assert ilo.get_persistent_boot_device() == "CDROM"
    if args.uefi_cd_entry_when_connected:
        ilo.eject_virtual_media(device="CDROM")
    ilo.set_pending_boot_mode("LEGACY")
    ilo.set_host_power("OFF")
    ilo.set_host_power("ON")
    assert ilo.get_current_boot_mode() == "LEGACY"
    ilo.set_host_power("OFF")

    # --- virtual media ---------------------------------------------------------------------
    vm = ilo.get_vm_status("CDROM")
    assert vm["IMAGE_INSERTED"] == "NO" and vm["BOOT_OPTION"] == "NO_BOOT", vm
    assert vm["WRITE_PROTECT"] == "YES", vm  # CD default
    assert ilo.get_vm_status("FLOPPY")["WRITE_PROTECT"] == "NO"  # floppy default
    # ironic's attach_vmedia: insert, then CONNECT with write protect (§1.8).
    ilo.insert_virtual_media(floppy, device="FLOPPY")
    ilo.set_vm_status(device="FLOPPY", boot_option="CONNECT", write_protect="YES")
    ilo.insert_virtual_media(iso, device="CDROM")
    vm = ilo.get_vm_status("CDROM")
    assert vm["IMAGE_INSERTED"] == "YES" and vm["IMAGE_URL"] == iso, vm
    assert vm["VM_APPLET"] == "DISCONNECTED", vm
    ilo.set_vm_status(device="CDROM", boot_option="BOOT_ONCE", write_protect="YES")
    vm = ilo.get_vm_status("CDROM")
    assert vm["BOOT_OPTION"] == "BOOT_ONCE", vm
    fl = ilo.get_vm_status("FLOPPY")
    assert fl["BOOT_OPTION"] == "BOOT_ALWAYS" and fl["VM_APPLET"] == "CONNECTED", fl
    assert fl["WRITE_PROTECT"] == "YES", fl
    st = state(args)
    assert st["vmedia"]["CDROM"]["image_size"] == 3 * 1024 * 1024, st  # learnt by the range read
    ilo.update_persistent_boot(["HDD"])
    ilo.set_host_power("ON")
    st = state(args)
    assert st["last_boot"]["device"] == "CDROM", st
    assert st["last_boot"]["media_url"] == iso, st
    assert st["last_boot"]["media_read_error"] is None, st  # the boot read the ISO by range
    # BOOT_ONCE media are spent by the boot.
    vm = ilo.get_vm_status("CDROM")
    assert vm["IMAGE_INSERTED"] == "NO" and vm["BOOT_OPTION"] == "NO_BOOT", vm
    # The CONNECTed floppy stays.
    assert ilo.get_vm_status("FLOPPY")["IMAGE_INSERTED"] == "YES"
    ilo.eject_virtual_media("FLOPPY")
    assert ilo.get_vm_status("FLOPPY")["IMAGE_INSERTED"] == "NO"
    ilo.eject_virtual_media("CDROM")  # nothing inserted: proliantutils skips the EJECT
    # One-time boot CDROM with a BOOT_ALWAYS medium.
    ilo.insert_virtual_media(iso, device="CDROM")
    ilo.set_vm_status(device="CDROM", boot_option="CONNECT", write_protect="YES")
    ilo.set_one_time_boot("CDROM")
    ilo.reset_server()
    st = state(args)
    assert st["last_boot"]["device"] == "CDROM" and st["last_boot"]["reason"] == "one_time", st
    assert st["vmedia"]["CDROM"]["inserted"] is True, st
    ilo.eject_virtual_media("CDROM")
    assert ilo.get_vm_status("CDROM")["IMAGE_INSERTED"] == "NO"
    # An invalid device: iLO's 0x0035 error.
    e = expect_raises(exception.IloError, r.get_vm_status, "DVD")
    assert "invalid Virtual Media option" in str(e), e

    # --- licences, health ------------------------------------------------------------------
    lic = ilo.get_all_licenses()
    assert lic["LICENSE_TYPE"] == "iLO Advanced", lic
    health = ilo.get_host_health_data()
    assert "GET_EMBEDDED_HEALTH_DATA" in health
    temps = ilo.get_host_health_temperature_sensors()
    assert len(temps) == 6 and temps[0]["CURRENTREADING"]["UNIT"] == "Celsius", temps
    fans = ilo.get_host_health_fan_sensors()
    assert len(fans) == 6 and fans[0]["SPEED"]["UNIT"] == "Percentage", fans
    assert ilo.get_host_health_present_power_reading() == "112 Watts"
    glance = ilo.get_host_health_at_a_glance()
    assert glance["TEMPERATURE"]["STATUS"] == "OK", glance
    assert {"STATUS": "OK"} in glance["FANS"], glance  # FANS carries STATUS and REDUNDANCY
    caps = ilo.get_server_capabilities()
    assert caps["server_model"] == "ProLiant DL380p Gen8", caps
    assert caps["ilo_firmware_version"].startswith(args.firmware), caps
    assert caps["rom_firmware_version"] == "P70 07/01/2015", caps
    props = ilo.get_essential_properties()
    assert props["properties"]["cpus"] == 32, props
    assert props["properties"]["memory_mb"] == 65536, props
    assert props["properties"]["local_gb"] == 278, props
    assert len(props["macs"]) == 2, props
    assert r.get_host_power_readings()["PRESENT_POWER_READING"]["VALUE"] == "112"
    # GET /xmldata?item=all (unauthenticated RIMP document): product and host UUID.
    assert ilo.get_host_uuid() == ("ProLiant DL380p Gen8", state(args)["uuid"]), ilo.get_host_uuid()

    # --- faults: the errors proliantutils raises for them -------------------------------------
    fault(args, kind="login_fail", count=1)
    expect_raises(exception.IloLoginFailError, r.get_host_power_status)
    fault(args, kind="ribcl_error", count=1)
    expect_raises(exception.IloError, r.get_host_power_status)
    fault(args, kind="http500", count=1)
    expect_raises(exception.IloConnectionError, r.get_host_power_status)
    fault(args, kind="wrong_root", count=1)
    expect_raises(exception.IloClientInternalError, r.get_host_power_status)
    assert r.get_host_power_status() == "ON"  # faults are spent
    bad = ribcl.RIBCLOperations(args.ilo, args.user, "wrong", timeout=20, port=None,
                                cacert=args.cacert)
    e = expect_raises(exception.IloLoginFailError, bad.get_host_power_status)
    print("proliantutils: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
