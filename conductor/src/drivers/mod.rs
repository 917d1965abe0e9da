//! Hardware interfaces split as in Ironic: power, management (boot device, boot mode), and the
//! clients that carry them out.

pub mod ilo;
