//! Statistics shared by the experiment summaries, the cache-strategy benchmark and the
//! benches: one median and one guarded ratio, so every report computes them alike.

/// The median of `values` (the mean of the two middle values for an even count; NaNs sort
/// last). `None` for no values: there is no median of nothing, and each caller says what an
/// empty sample reports (a dash, a zero, or an error).
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// `num / den` when `den > 0` and `num` is finite; `None` otherwise: no rate over an empty
/// or zero denominator (no tokens, no time), nor from a numerator that is already undefined
/// (a time per step over zero steps).
pub fn ratio(num: f64, den: f64) -> Option<f64> {
    (den > 0.0 && num.is_finite()).then(|| num / den)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn ratio_needs_a_positive_denominator_and_a_finite_numerator() {
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
        assert_eq!(ratio(0.0, 2.0), Some(0.0));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(1.0, -1.0), None);
        assert_eq!(ratio(1.0, f64::NAN), None);
        assert_eq!(ratio(f64::INFINITY, 1.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
    }
}
