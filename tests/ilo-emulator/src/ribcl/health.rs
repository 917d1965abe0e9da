//! GET_EMBEDDED_HEALTH and GET_POWER_READINGS payloads of an emulated DL380p Gen8.
//!
//! The element layout is the one proliantutils consumes (docs/ilo-management.md §1.6): FANS/FAN, TEMPERATURE/
//! TEMP, POWER_SUPPLIES/POWER_SUPPLY_SUMMARY, PROCESSORS, MEMORY/MEMORY_DETAILS_SUMMARY (Gen8),
//! NIC_INFORMATION, STORAGE, FIRMWARE_INFORMATION/INDEX_n, HEALTH_AT_A_GLANCE. The readings are
//! invented but plausible; they do not drift.

use crate::xml::escape;

/// Present power draw: a real Gen8 draws a few watts for the iLO even when off.
pub fn present_watts(on: bool) -> u32 {
    if on {
        112
    } else {
        9
    }
}

/// Fan speeds in percent, fans 1 to 6 (shared with the Redfish Thermal resource).
pub const FAN_SPEEDS: [&str; 6] = ["19", "19", "23", "23", "19", "19"];

/// Temperature sensors: label, location, reading, caution and critical thresholds in °C (shared
/// with the Redfish Thermal resource).
pub const TEMPERATURES: [(&str, &str, &str, &str, &str); 6] = [
    ("01-Inlet Ambient", "Ambient", "21", "42", "46"),
    ("02-CPU 1", "CPU", "40", "70", "0"),
    ("03-CPU 2", "CPU", "40", "70", "0"),
    ("04-P1 DIMM 1-6", "Memory", "33", "87", "0"),
    ("05-HD Max", "System", "35", "60", "0"),
    ("06-Chipset", "System", "49", "105", "0"),
];

fn v(tag: &str, value: &str) -> String {
    format!("<{tag} VALUE = \"{}\"/>", escape(value))
}

/// The GET_EMBEDDED_HEALTH_DATA element.
pub fn embedded_health(on: bool, firmware_version: &str) -> String {
    let mut s = String::with_capacity(6000);
    s.push_str("<GET_EMBEDDED_HEALTH_DATA>\n<FANS>\n");
    for (i, speed) in (1..).zip(FAN_SPEEDS) {
        s.push_str(&format!(
            "<FAN>\n{}\n{}\n{}\n<SPEED VALUE = \"{speed}\" UNIT=\"Percentage\"/>\n</FAN>\n",
            v("ZONE", "System"),
            v("LABEL", &format!("Fan {i}")),
            v("STATUS", "OK"),
        ));
    }
    s.push_str("</FANS>\n<TEMPERATURE>\n");
    for (label, location, current, caution, critical) in TEMPERATURES {
        s.push_str(&format!(
            "<TEMP>\n{}\n{}\n{}\n<CURRENTREADING VALUE = \"{current}\" UNIT=\"Celsius\"/>\n<CAUTION VALUE = \"{caution}\" UNIT=\"Celsius\"/>\n<CRITICAL VALUE = \"{critical}\" UNIT=\"Celsius\"/>\n</TEMP>\n",
            v("LABEL", label),
            v("LOCATION", location),
            v("STATUS", "OK"),
        ));
    }
    s.push_str("</TEMPERATURE>\n<POWER_SUPPLIES>\n<POWER_SUPPLY_SUMMARY>\n");
    s.push_str(&v(
        "PRESENT_POWER_READING",
        &format!("{} Watts", present_watts(on)),
    ));
    s.push('\n');
    s.push_str(&v("POWER_MANAGEMENT_CONTROLLER_FIRMWARE_VERSION", "3.3"));
    s.push('\n');
    s.push_str(&v("POWER_SYSTEM_REDUNDANCY", "Redundant"));
    s.push('\n');
    s.push_str(&v("HP_POWER_DISCOVERY_SERVICES_REDUNDANCY_STATUS", "N/A"));
    s.push('\n');
    s.push_str(&v("HIGH_EFFICIENCY_MODE", "Balanced"));
    s.push_str("\n</POWER_SUPPLY_SUMMARY>\n");
    for i in 1..=2 {
        s.push_str(&format!(
            "<SUPPLY>\n{}\n{}\n{}\n{}\n{}\n</SUPPLY>\n",
            v("LABEL", &format!("Power Supply {i}")),
            v("PRESENT", "Yes"),
            v("STATUS", "Good, In Use"),
            v("MODEL", "656362-B21"),
            v("CAPACITY", "460 Watts"),
        ));
    }
    s.push_str("</POWER_SUPPLIES>\n<PROCESSORS>\n");
    for i in 1..=2 {
        s.push_str(&format!(
            "<PROCESSOR>\n{}\n{}\n{}\n{}\n{}\n{}\n</PROCESSOR>\n",
            v("LABEL", &format!("Proc {i}")),
            v("NAME", " Intel(R) Xeon(R) CPU E5-2650 0 @ 2.00GHz      "),
            v("STATUS", "OK"),
            v("SPEED", "2000 MHz"),
            v("EXECUTION_TECHNOLOGY", "8/8 cores; 16 threads"),
            v("MEMORY_TECHNOLOGY", "64-bit Capable"),
        ));
    }
    s.push_str("</PROCESSORS>\n<MEMORY>\n<ADVANCED_MEMORY_PROTECTION>\n");
    s.push_str(&v("AMP_MODE_STATUS", "Advanced ECC"));
    s.push_str("\n</ADVANCED_MEMORY_PROTECTION>\n<MEMORY_DETAILS_SUMMARY>\n");
    for cpu in 1..=2 {
        s.push_str(&format!(
            "<CPU_{cpu}>\n{}\n{}\n{}\n{}\n</CPU_{cpu}>\n",
            v("NUMBER_OF_SOCKETS", "12"),
            v("TOTAL_MEMORY_SIZE", "32 GB"),
            v("OPERATING_FREQUENCY", "1333 MHz"),
            v("OPERATING_VOLTAGE", "1.35 v"),
        ));
    }
    s.push_str("</MEMORY_DETAILS_SUMMARY>\n</MEMORY>\n<NIC_INFORMATION>\n");
    for port in 1..=2 {
        s.push_str(&format!(
            "<NIC>\n{}\n{}\n{}\n{}\n{}\n{}\n</NIC>\n",
            v("NETWORK_PORT", &format!("Port {port}")),
            v("PORT_DESCRIPTION", "HP Ethernet 1Gb 4-port 331i Adapter"),
            v("LOCATION", "Embedded"),
            v(
                "MAC_ADDRESS",
                &format!("2c:76:8a:5a:30:{:02x}", 0x10 + port)
            ),
            v("IP_ADDRESS", "N/A"),
            v("STATUS", "Unknown"),
        ));
    }
    s.push_str("</NIC_INFORMATION>\n<STORAGE>\n<CONTROLLER>\n");
    s.push_str(&format!(
        "{}\n{}\n{}\n{}\n",
        v("LABEL", "Controller on System Board"),
        v("STATUS", "OK"),
        v("CONTROLLER_STATUS", "OK"),
        v("MODEL", "Smart Array P420i Controller"),
    ));
    s.push_str("<LOGICAL_DRIVE>\n");
    s.push_str(&format!(
        "{}\n{}\n{}\n{}\n",
        v("LABEL", "01"),
        v("STATUS", "OK"),
        v("CAPACITY", "279 GB"),
        v("FAULT_TOLERANCE", "RAID 1/RAID 1+0"),
    ));
    s.push_str("</LOGICAL_DRIVE>\n</CONTROLLER>\n</STORAGE>\n<FIRMWARE_INFORMATION>\n");
    let firmware = [
        ("HP ProLiant System ROM", "P70 07/01/2015"),
        ("HP ProLiant System ROM - Backup", "P70 02/10/2014"),
        ("iLO", firmware_version),
        ("Power Management Controller Firmware", "3.3"),
        ("Smart Array P420i Controller", "5.42"),
    ];
    for (i, (name, version)) in firmware.iter().enumerate() {
        s.push_str(&format!(
            "<INDEX_{n}>\n{}\n{}\n</INDEX_{n}>\n",
            v("FIRMWARE_NAME", name),
            v("FIRMWARE_VERSION", version),
            n = i + 1
        ));
    }
    s.push_str("</FIRMWARE_INFORMATION>\n<HEALTH_AT_A_GLANCE>\n");
    s.push_str("<BIOS_HARDWARE STATUS= \"OK\"/>\n<FANS STATUS= \"OK\"/>\n<FANS REDUNDANCY= \"Redundant\"/>\n<TEMPERATURE STATUS= \"OK\"/>\n<POWER_SUPPLIES STATUS= \"OK\"/>\n<POWER_SUPPLIES REDUNDANCY= \"Redundant\"/>\n<PROCESSOR STATUS= \"OK\"/>\n<MEMORY STATUS= \"OK\"/>\n<NETWORK STATUS= \"OK\"/>\n<STORAGE STATUS= \"OK\"/>\n");
    s.push_str("</HEALTH_AT_A_GLANCE>\n</GET_EMBEDDED_HEALTH_DATA>\n");
    s
}

/// The GET_POWER_READINGS element.
pub fn power_readings(on: bool) -> String {
    let w = present_watts(on).to_string();
    format!(
        "<GET_POWER_READINGS>\n    <PRESENT_POWER_READING VALUE=\"{w}\" UNIT=\"Watts\"/>\n    <AVERAGE_POWER_READING VALUE=\"{w}\" UNIT=\"Watts\"/>\n    <MAXIMUM_POWER_READING VALUE=\"{max}\" UNIT=\"Watts\"/>\n    <MINIMUM_POWER_READING VALUE=\"{min}\" UNIT=\"Watts\"/>\n</GET_POWER_READINGS>\n",
        max = present_watts(true) + 40,
        min = present_watts(false),
    )
}
