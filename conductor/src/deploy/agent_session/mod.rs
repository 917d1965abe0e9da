//! What the agent deploy and cleaning share with the agent ramdisk: its command API client.

pub mod client;
