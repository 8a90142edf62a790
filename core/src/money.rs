//! Money as integer micro-dollars. Never a float inside Switchyard: floats appear only at the
//! edges (JSON numbers typed by people) and are converted here, once, with explicit rounding.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// An amount in micro-dollars (1 USD = 1,000,000).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Money(pub i64);

pub const MICROS_PER_DOLLAR: i64 = 1_000_000;

impl Money {
    pub const ZERO: Money = Money(0);
    pub const MAX: Money = Money(i64::MAX);

    pub const fn from_micros(micros: i64) -> Money {
        Money(micros)
    }

    pub const fn micros(self) -> i64 {
        self.0
    }

    /// Converts a dollar figure typed by a person (a JSON number, a CSV cell). Returns `None` for
    /// NaN, infinities and amounts beyond ±9 trillion dollars. Rounds to the nearest micro-dollar.
    pub fn from_dollars(dollars: f64) -> Option<Money> {
        if !dollars.is_finite() || dollars.abs() > 9.0e12 {
            return None;
        }
        Some(Money((dollars * MICROS_PER_DOLLAR as f64).round() as i64))
    }

    /// Dollars as a float, for display and JSON output only.
    pub fn as_dollars(self) -> f64 {
        self.0 as f64 / MICROS_PER_DOLLAR as f64
    }

    /// The cost of running at `self` per hour for `seconds`, rounded up to the micro-dollar.
    pub fn per_hour_for_secs(self, seconds: i64) -> Money {
        let seconds = seconds.max(0);
        // The planner prices millions of candidates: stay in i64 (a multiply-shift for the
        // constant divisor) unless the product overflows; 128-bit division is a library call.
        if let Some(num) = self
            .0
            .checked_mul(seconds)
            .and_then(|n| n.checked_add(3599))
        {
            return Money(num / 3600);
        }
        let num = self.0 as i128 * seconds as i128;
        let cost = (num + 3599) / 3600;
        Money(cost.clamp(i64::MIN as i128, i64::MAX as i128) as i64)
    }

    /// Money as people read it, one format everywhere (console, CLI, reasons): cents, plus a
    /// fraction of a cent under a dollar where it matters, thousands grouped: `$0.0145`,
    /// `$2.94`, `$1,204.50`, `-$0.50`.
    pub fn usd_text(self) -> String {
        let sign = if self.0 < 0 { "-" } else { "" };
        let abs = self.0.unsigned_abs();
        // Decided after rounding to four places, so `$0.99999` reads `$1.00`, not `$1.0000`.
        let ten_thousandths = (abs + 50) / 100;
        let (whole, frac) = if abs >= 1_000_000 || ten_thousandths.is_multiple_of(100) {
            let cents = (abs + 5_000) / 10_000;
            (cents / 100, format!("{:02}", cents % 100))
        } else {
            (
                ten_thousandths / 10_000,
                format!("{:04}", ten_thousandths % 10_000),
            )
        };
        let digits = whole.to_string();
        let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
        for (i, ch) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                grouped.push(',');
            }
            grouped.push(ch);
        }
        format!("{sign}${grouped}.{frac}")
    }

    pub fn saturating_add(self, other: Money) -> Money {
        Money(self.0.saturating_add(other.0))
    }

    pub fn saturating_sub(self, other: Money) -> Money {
        Money(self.0.saturating_sub(other.0))
    }

    pub fn saturating_mul(self, n: i64) -> Money {
        Money(self.0.saturating_mul(n))
    }

    /// Divides, rounding up (a per-GPU share of a node price never undercharges).
    pub fn div_ceil(self, n: i64) -> Money {
        if n <= 0 {
            return self;
        }
        Money((self.0 + n - 1).div_euclid(n))
    }
}

impl Add for Money {
    type Output = Money;
    fn add(self, rhs: Money) -> Money {
        self.saturating_add(rhs)
    }
}

impl AddAssign for Money {
    fn add_assign(&mut self, rhs: Money) {
        *self = self.saturating_add(rhs);
    }
}

impl Sub for Money {
    type Output = Money;
    fn sub(self, rhs: Money) -> Money {
        Money(self.0.saturating_sub(rhs.0))
    }
}

impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let abs = self.0.unsigned_abs();
        write!(f, "{sign}${}.{:06}", abs / 1_000_000, abs % 1_000_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usd_text_shows_cents_and_a_fraction_of_a_cent_where_it_matters() {
        for (micros, shown) in [
            (14_500, "$0.0145"),
            (13_334, "$0.0133"),
            (5_030_000, "$5.03"),
            (500_000, "$0.50"),
            (0, "$0.00"),
            (1_204_500_000, "$1,204.50"),
            (-1_204_500_000, "-$1,204.50"),
            (1_234_567_891_000, "$1,234,567.89"),
            (2_945_000, "$2.95"),
            (-500_000, "-$0.50"),
            (999_990, "$1.00"),
            (999_500, "$0.9995"),
            (40, "$0.00"),
            (10_040, "$0.01"),
        ] {
            assert_eq!(Money(micros).usd_text(), shown, "{micros}");
        }
    }

    #[test]
    fn dollars_round_trip_to_the_micro() {
        assert_eq!(Money::from_dollars(1.006), Some(Money(1_006_000)));
        assert_eq!(Money::from_dollars(55.04), Some(Money(55_040_000)));
        assert_eq!(Money::from_dollars(f64::NAN), None);
        assert_eq!(Money::from_dollars(1e20), None);
        assert_eq!(Money(2_500_000).to_string(), "$2.500000");
        assert_eq!(Money(-1).to_string(), "-$0.000001");
    }

    #[test]
    fn hourly_cost_rounds_up() {
        // $3.60/h for one second is exactly $0.001.
        assert_eq!(Money(3_600_000).per_hour_for_secs(1), Money(1_000));
        // $1/h for one second is 277.7… micro-dollars: rounded up.
        assert_eq!(Money(1_000_000).per_hour_for_secs(1), Money(278));
        assert_eq!(Money(1_000_000).per_hour_for_secs(-5), Money(0));
        // Past i64 in the product: the wide path, exact, then saturating.
        assert_eq!(
            Money(i64::MAX / 2).per_hour_for_secs(7200),
            Money(i64::MAX - 1)
        );
        assert_eq!(Money(i64::MAX).per_hour_for_secs(3600), Money(i64::MAX));
        assert_eq!(Money(i64::MAX).per_hour_for_secs(7200), Money(i64::MAX));
        assert_eq!(Money(-3_600_000).per_hour_for_secs(1), Money(-1_000 + 1));
        assert_eq!(Money(10).div_ceil(4), Money(3));
    }
}
