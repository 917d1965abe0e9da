#!/usr/bin/env bash
# Regenerates fuzz/seeds/: the iSCSI conversations from our encoders and target
# (examples/seeds.rs), small disk images from the tools the images come from in real use
# (qemu-img, mkfs.vfat + mtools, sgdisk, sfdisk), and short text bodies written here.
# The seeds only start each target's corpus: bench/fuzz.sh copies them into fuzz/corpus/.
set -euo pipefail
FUZZ="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
S="$FUZZ/seeds"
cargo run --quiet --manifest-path "$FUZZ/Cargo.toml" --example seeds
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$S"/{qcow2,partition_tables,floppy,configdrive,http_response,dhcp,tftp,ribcl,redfish,agent_api,ramdisk_callbacks,json_patch,http_range,iscsi_keys,scsi}

# qcow2: 1 MiB guest with a few written clusters (L1, L2, refcounts, data).
printf 'hello qcow2' >"$tmp/raw" && truncate -s 1M "$tmp/raw"
qemu-img convert -q -f raw -O qcow2 -o cluster_size=4096 "$tmp/raw" "$S/qcow2/small-v3.qcow2"
qemu-img convert -q -f raw -O qcow2 -o compat=0.10,cluster_size=4096 "$tmp/raw" "$S/qcow2/small-v2.qcow2"

# Partition tables: 64 KiB disks, GPT (with an ESP) and MBR.
truncate -s 64K "$tmp/gpt" "$tmp/mbr"
sgdisk -q -o -n 1:34:60 -t 1:ef00 -n 2:61:100 -t 2:8300 "$tmp/gpt" >/dev/null
printf 'label: dos\nstart=1, size=40, type=ef, bootable\nstart=41, size=60, type=83\n' |
    sfdisk -q "$tmp/mbr" >/dev/null
cp "$tmp/gpt" "$S/partition_tables/gpt-esp"
cp "$tmp/mbr" "$S/partition_tables/mbr-esp"

# The floppy: a 64 KiB FAT12 with parameters.txt (mode byte 1: an image), and the text alone.
truncate -s 64K "$tmp/fat"
mkfs.vfat -n VMEDIA_BOOT -S 512 "$tmp/fat" >/dev/null
printf 'ipa-api-url=http://10.0.0.1:6385\nboot_mode=uefi\nroot_device=size=10,serial=abc%%2C1\nBOOTIF=52:54:00:12:34:56\n' >"$tmp/parameters.txt"
mcopy -i "$tmp/fat" "$tmp/parameters.txt" ::parameters.txt
{ printf '\001'; cat "$tmp/fat"; } >"$S/floppy/fat-image"
{ printf '\000'; cat "$tmp/parameters.txt"; } >"$S/floppy/text"

# Config drive: the vfat image above as Ironic sends it (mode 0: base64 of gzip), and raw
# (mode 2: the target gzips and encodes it).
{ printf '\000'; gzip -c "$tmp/fat" | base64 -w0; } >"$S/configdrive/vfat-b64-gzip"
{ printf '\002'; cat "$tmp/fat"; } >"$S/configdrive/vfat-raw"

printf 'HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello' >"$S/http_response/length"
printf 'HTTP/1.1 206 Partial Content\r\nTransfer-Encoding: chunked\r\nContent-Range: bytes 10-14/100\r\n\r\n5;x=y\r\nhello\r\n0\r\nTrailer: 1\r\n\r\n' >"$S/http_response/chunked"
printf '\000\000\000\000\000\000\000\144bytes=0-49' >"$S/http_range/bounded"
printf '\001\000\001\000\000\000\000\000bytes=-10' >"$S/http_range/suffix"

printf '\000\001boot.ipxe\000octet\000blksize\0001468\000tsize\0000\000' >"$S/tftp/rrq-options"
printf '\000\003\000\001data' >"$S/tftp/data"
printf '\000\005\000\001File not found\000' >"$S/tftp/error"

# DHCP ACK as a UDP payload (mode 0): BOOTREPLY, cookie, type 5, mask, router, DNS, lease.
{
    printf '\000\002\001\006\000\001\002\003\004\000\000\200\000'
    printf '\000\000\000\000\012\000\000\052\012\000\000\001\000\000\000\000'
    printf '\122\124\000\022\064\126'; head -c 10 /dev/zero; head -c 192 /dev/zero
    printf '\143\202\123\143\065\001\005\066\004\012\000\000\001\001\004\377\377\377\000'
    printf '\003\004\012\000\000\001\006\010\010\010\010\010\001\001\001\001\063\004\000\000\016\020\377'
} >"$S/dhcp/ack"

printf '<?xml version="1.0"?>\r\n<RIBCL VERSION="2.23">\r\n<RESPONSE STATUS="0x0000" MESSAGE="No error"/>\r\n<GET_HOST_POWER HOST_POWER="ON"/>\r\n</RIBCL>\r\n<?xml version="1.0"?>\r\n<RIBCL VERSION="2.23">\r\n<RESPONSE STATUS="0x0000" MESSAGE="No error"/>\r\n<PERSISTENT_BOOT><DEVICE value="CDROM" DESCRIPTION="cd"/><DEVICE value="Boot000A" DESCRIPTION="UEFI disk"/></PERSISTENT_BOOT>\r\n<GET_VM_STATUS VM_APPLET="CONNECTED" DEVICE="CDROM" BOOT_OPTION="BOOT_ONCE" WRITE_PROTECT="YES" IMAGE_INSERTED="YES" IMAGE_URL="http://x/y.iso"/>\r\n</RIBCL>\r\n' >"$S/ribcl/power-boot-vm"
printf '{"PowerState":"On","Boot":{"BootSourceOverrideTarget":"Cd","BootSourceOverrideEnabled":"Once","BootSourceOverrideMode":"UEFI","BootOrder":["Boot0001"]},"Members":[{"@odata.id":"/redfish/v1/Systems/1/"}],"Actions":{"#ComputerSystem.Reset":{"target":"/redfish/v1/Systems/1/Actions/ComputerSystem.Reset/"}},"Oem":{"Hpe":{"Bios":{"Current":{"BootMode":"Uefi"}}}}}' >"$S/redfish/system"
printf '{"Temperatures":[{"Name":"CPU","ReadingCelsius":40,"Status":{"Health":"OK"}}],"Fans":[{"Name":"Fan 1","Reading":30}],"PowerSupplies":[{"Name":"PS1","PowerCapacityWatts":800}],"error":{"@Message.ExtendedInfo":[{"MessageId":"iLO.2.1.LicenseKeyRequired"}]}}' >"$S/redfish/thermal-power-error"

printf '{"name":"standby.prepare_image","params":{"image_info":{"id":"img","urls":["http://x/y.img"],"os_hash_algo":"sha256","os_hash_value":"%s","image_type":"partition","root_mb":100,"swap_mb":0,"ephemeral_mb":0,"boot_option":"netboot"},"configdrive":"H4sIAAAAAAAAA2NgGAWjYBSMglEwCkYBAAZ3AAQA"}}' "$(printf '0%.0s' $(seq 64))" >"$S/agent_api/prepare-image"
printf '{"name":"iscsi.start_iscsi_target","params":{"iqn":"iqn.2008-10.org.openstack:n1","portal_port":3260,"wipe_disk_metadata":true}}' >"$S/agent_api/iscsi"
printf '{"name":"clean.execute_clean_step","params":{"step":{"step":"erase_devices_metadata","interface":"deploy","priority":0},"node":{},"ports":[],"clean_version":{"generic_hardware_manager":"1.1"}}}' >"$S/agent_api/clean"
printf '{"name":"image.install_bootloader","params":{"root_uuid":"0x12345678","efi_system_part_uuid":"a-b","target_boot_mode":"uefi"}}' >"$S/agent_api/bootloader"

printf '{"callback_url":"https://10.0.0.2:9999","agent_version":"10.0.0","agent_token":"x","agent_verify_ca":"pem","agent_status":"start","agent_status_message":"image write: written=5 total=10 rate=1"}' >"$S/ramdisk_callbacks/heartbeat"
printf '{"address":"10.0.0.2","iqn":"iqn.2008-10.org.openstack:n1","key":"abc","error":null}' >"$S/ramdisk_callbacks/pass-deploy-info"
printf '{"id":"1","command_name":"prepare_image","command_status":"FAILED","command_error":{"type":"ImageWriteError","code":500,"message":"m","details":"d"},"command_result":null,"command_params":{}}' >"$S/ramdisk_callbacks/command-result"

printf '[{"op":"add","path":"/driver_info/ilo_password","value":"x"},{"op":"remove","path":"/instance_info/nested"},{"op":"replace","path":"/driver_info/list/1","value":[1]},{"op":"add","path":"/driver_info/list/-","value":null}]' >"$S/json_patch/mixed"

printf 'InitiatorName=iqn.2004-10.org.vmdeploy:c\000SessionType=Normal\000MaxRecvDataSegmentLength=262144\000HeaderDigest=CRC32C,None\000CHAP_A=5\000CHAP_I=7\000CHAP_C=0x0102030405060708\000CHAP_N=user\000CHAP_R=0bAAECAwQFBgcICQoLDA0ODw==\000TargetAddress=10.0.0.1:3260,1\000' >"$S/iscsi_keys/login"
printf '\x9e\000\000\000\000\000\000\000\000\000\000\000\000\040\000\000' >"$S/scsi/read-capacity-16"
printf '\x2a\000\000\000\000\000\000\000\010\000\000\000\000\000\000\000' >"$S/scsi/write-10"
printf '\x5f\001\000\000\000\000\000\000\030\000\000\000\000\000\000\000' >"$S/scsi/pr-out"
# The deploy CD: a small ISO from xorriso (no padding) with a modules.alias, and the alias text
# alone (mode byte 1).
mkdir -p "$S/deploy_cd" "$tmp/cd/boot"
printf 'alias pci:v00008086d00001533sv*sd*bc*sc*i* igb\nalias pci:v*d*sv*sd*bc01sc08i02* nvme\n' >"$tmp/cd/boot/modules.alias"
xorriso -as mkisofs -quiet -no-pad -V VMEDIA_BOOT_ISO -o "$tmp/cd.iso" "$tmp/cd"
{ printf '\000'; cat "$tmp/cd.iso"; } >"$S/deploy_cd/xorriso-iso"
{ printf '\001'; cat "$tmp/cd/boot/modules.alias"; } >"$S/deploy_cd/modules-alias"
ls "$S"/* | head -100 >/dev/null
echo "seeds written to $S" >&2
