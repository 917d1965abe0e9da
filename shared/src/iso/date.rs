//! Fixed timestamps for the images we write: every date in an ISO (and in its EFI FAT image)
//! comes from one epoch the caller gives, never from the clock, so the same inputs give the same
//! bytes (`SOURCE_DATE_EPOCH` is the caller's business).

use super::IsoError;

/// The epoch used when the caller gives none: 2026-01-01 00:00:00 UTC.
pub const DEFAULT_EPOCH: u64 = 1_767_225_600;

/// Latest epoch every date field can hold: ISO 9660 directory records count years from 1900 in
/// one byte (up to 2155), FAT from 1980 in seven bits (up to 2107).
const MAX_EPOCH: u64 = 4_354_819_199; // 2107-12-31 23:59:59 UTC

/// A UTC calendar time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Civil {
    /// Year, 1970 or later.
    pub year: u32,
    /// Month, 1–12.
    pub month: u32,
    /// Day of the month, 1–31.
    pub day: u32,
    /// Hour, 0–23.
    pub hour: u32,
    /// Minute, 0–59.
    pub minute: u32,
    /// Second, 0–59.
    pub second: u32,
}

impl Civil {
    /// The calendar time of `epoch` (seconds since 1970-01-01 UTC); FAT cannot store a date
    /// before 1980, so earlier epochs and those after 2107 are refused.
    pub fn from_epoch(epoch: u64) -> Result<Civil, IsoError> {
        if !(315_532_800..=MAX_EPOCH).contains(&epoch) {
            return Err(IsoError::Invalid(format!(
                "timestamp {epoch} is outside 1980-01-01..2107-12-31, which ISO 9660 and FAT can \
                 both store"
            )));
        }
        let days = epoch / 86_400;
        let secs = epoch % 86_400;
        let (year, month, day) = civil_from_days(days);
        // Each value is bounded by the arithmetic above (secs < 86400, days < 2^32).
        Ok(Civil {
            year,
            month,
            day,
            hour: (secs / 3600) as u32,
            minute: (secs / 60 % 60) as u32,
            second: (secs % 60) as u32,
        })
    }
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar (Howard
/// Hinnant's `civil_from_days`, for non-negative day counts).
fn civil_from_days(days: u64) -> (u32, u32, u32) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    // Bounded by MAX_EPOCH: year < 2108.
    (year as u32, month as u32, day as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        let c = Civil::from_epoch(DEFAULT_EPOCH).expect("in range");
        assert_eq!(
            (c.year, c.month, c.day, c.hour, c.minute, c.second),
            (2026, 1, 1, 0, 0, 0)
        );
        // 2000-02-29 12:34:56 UTC, a leap day.
        let c = Civil::from_epoch(951_827_696).expect("in range");
        assert_eq!(
            (c.year, c.month, c.day, c.hour, c.minute, c.second),
            (2000, 2, 29, 12, 34, 56)
        );
        let c = Civil::from_epoch(MAX_EPOCH).expect("in range");
        assert_eq!((c.year, c.month, c.day), (2107, 12, 31));
    }

    #[test]
    fn out_of_range_is_an_error() {
        assert!(Civil::from_epoch(0).is_err());
        assert!(Civil::from_epoch(MAX_EPOCH + 1).is_err());
    }
}
