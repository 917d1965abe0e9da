"""python-hpilo (PyPI) drives the vmdeploy iLO emulator over RIBCL, as an independent client.

python-hpilo speaks raw HTTP over TLS itself (its own request framing, the XML declaration in a
separate write, lower-case `value=` attributes) and accepts only chunked replies, so it checks
the emulator's wire framing more strictly than proliantutils (docs/ilo-management.md §1.1, §5.2).

Run by tests/integration/tests/ilo_emulator_proliantutils.rs:
    python ilo_emulator_hpilo.py --ilo 127.0.0.1:PORT --user U --password P \
        --image-base http://127.0.0.1:PORT2/ --cacert CERT.pem
"""

import argparse
import ssl
import sys
import urllib.request
import warnings

import hpilo

from emulator_admin import admin, expect_raises


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ilo", required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--password", required=True)
    p.add_argument("--image-base", required=True)
    p.add_argument("--cacert", required=True)
    args = p.parse_args()
    host, port = args.ilo.rsplit(":", 1)
    iso = args.image_base + "deploy.iso"
    ctx = ssl.create_default_context(cafile=args.cacert)
    # Informational RESPONSE messages ("Host power is already OFF.") come as IloWarning.
    warnings.simplefilter("ignore", hpilo.IloWarning)
    ilo = hpilo.Ilo(host, args.user, args.password, timeout=20, port=int(port),
                    ssl_context=ctx)

    assert ilo.get_product_name() == "ProLiant DL380p Gen8"
    assert ilo.protocol == hpilo.ILO_HTTP  # protocol detection saw an HTTP/1.1 200
    fw = ilo.get_fw_version()
    assert fw["management_processor"] == "iLO4" and fw["license_type"] == "iLO Advanced", fw

    # power
    assert ilo.get_host_power_status() == "OFF"
    ilo.set_host_power(True)
    assert ilo.get_host_power_status() == "ON"
    ilo.reset_server()
    assert admin(args, "/_emulator/state")["boots"] == 2
    ilo.hold_pwr_btn()
    assert ilo.get_host_power_status() == "OFF"
    ilo.hold_pwr_btn(toggle=True)  # TOGGLE=YES from off powers on
    assert ilo.get_host_power_status() == "ON"
    ilo.press_pwr_btn()
    assert ilo.get_host_power_status() == "OFF"

    # boot devices (python-hpilo sends upper-case VALUE on these)
    assert ilo.get_one_time_boot() == "normal"
    ilo.set_one_time_boot("cdrom")
    assert ilo.get_one_time_boot() == "cdrom"
    ilo.set_one_time_boot("normal")
    assert ilo.get_one_time_boot() == "normal"
    assert ilo.get_persistent_boot() == ["cdrom", "floppy", "usb", "hdd", "network"]
    ilo.set_persistent_boot("network,hdd")
    assert ilo.get_persistent_boot()[:2] == ["network", "hdd"]

    # boot mode
    assert ilo.get_supported_boot_mode() == "LEGACY_UEFI"
    assert ilo.get_current_boot_mode() == "LEGACY"
    ilo.set_pending_boot_mode("uefi")
    assert ilo.get_pending_boot_mode() == "UEFI"
    assert ilo.get_current_boot_mode() == "LEGACY"
    ilo.set_host_power(True)
    assert ilo.get_current_boot_mode() == "UEFI"
    boot = ilo.get_persistent_boot()  # UEFI: (id, description) pairs
    assert boot[0][0] == "Boot0009" and "NIC" in boot[0][1], boot
    ilo.set_host_power(False)

    # virtual media (python-hpilo sends lower-case value= on VM_BOOT_OPTION)
    vm = ilo.get_vm_status("cdrom")
    assert vm["image_inserted"] == "NO" and vm["write_protect"] == "YES", vm
    ilo.insert_virtual_media("cdrom", iso)
    ilo.set_vm_status("cdrom", "boot_once", True)
    vm = ilo.get_vm_status("cdrom")
    assert vm["image_inserted"] == "YES" and vm["boot_option"] == "BOOT_ONCE", vm
    assert vm["image_url"] == iso, vm
    ilo.set_host_power(True)
    st = admin(args, "/_emulator/state")
    assert st["last_boot"]["device"] == "CDROM" and st["last_boot"]["media_url"] == iso, st
    vm = ilo.get_vm_status("cdrom")
    assert vm["image_inserted"] == "NO" and vm["boot_option"] == "NO_BOOT", vm
    # connect = BOOT_ALWAYS, connected at once
    ilo.insert_virtual_media("cdrom", iso)
    ilo.set_vm_status("cdrom", "connect", True)
    vm = ilo.get_vm_status("cdrom")
    assert vm["boot_option"] == "BOOT_ALWAYS" and vm["vm_applet"] == "CONNECTED", vm
    ilo.set_vm_status("cdrom", "disconnect", True)
    vm = ilo.get_vm_status("cdrom")
    assert vm["boot_option"] == "NO_BOOT" and vm["vm_applet"] == "DISCONNECTED", vm
    ilo.eject_virtual_media("cdrom")
    assert ilo.get_vm_status("cdrom")["image_inserted"] == "NO"
    # eject of an empty drive: an iLO error
    expect_raises(hpilo.IloError, ilo.eject_virtual_media, "cdrom")
    # a URL that does not answer: the emulator's range read fails the insert, like iLO
    e = expect_raises(hpilo.IloError, ilo.insert_virtual_media, "cdrom",
                      args.image_base + "missing.iso")
    assert "404" in str(e), e
    assert ilo.get_vm_status("cdrom")["image_inserted"] == "NO"

    # licences, health
    lic = ilo.get_all_licenses()
    assert lic[0]["license_type"] == "iLO Advanced", lic
    health = ilo.get_embedded_health()
    assert health["health_at_a_glance"]["fans"]["status"] == "OK", health["health_at_a_glance"]
    assert "01-Inlet Ambient" in health["temperature"], health["temperature"].keys()
    assert health["firmware_information"]["iLO"].startswith("2.55"), health["firmware_information"]
    readings = ilo.get_power_readings()
    assert readings["present_power_reading"] == (112, "Watts"), readings

    # login failure and faults, as python-hpilo reports them
    bad = hpilo.Ilo(host, args.user, "wrong", timeout=20, port=int(port), ssl_context=ctx)
    expect_raises(hpilo.IloLoginFailed, bad.get_host_power_status)
    ilo.protocol = hpilo.ILO_HTTP
    admin(args, "/_emulator/faults", {"kind": "login_fail", "count": 1})
    expect_raises(hpilo.IloLoginFailed, ilo.get_host_power_status)
    admin(args, "/_emulator/faults", {"kind": "ribcl_error", "count": 1,
                                      "status": "0x0023", "message": "Permission denied."})
    expect_raises(hpilo.IloPermissionError, ilo.get_host_power_status)
    admin(args, "/_emulator/faults", {"kind": "non_xml", "count": 1})
    expect_raises(Exception, ilo.get_host_power_status)
    admin(args, "/_emulator/faults", {"kind": "busy", "count": 1})
    e = expect_raises(hpilo.IloError, ilo.get_host_power_status)
    assert "busy" in str(e), e
    assert ilo.get_host_power_status() == "ON"
    print("python-hpilo: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
