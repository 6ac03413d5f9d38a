//! Kubernetes `resource.Quantity` parsing and canonical serialization, as the real server
//! applies it to every stored quantity: `16384Mi` is stored and returned as `16Gi`, `1000m`
//! as `1`, `0.5` as `500m`, `1536Mi` stays `1536Mi`, `1e3` stays `1e3`. Clients that compare
//! what they wrote with what they read must expect this.
//!
//! Values are held as `mantissa × 10^scale` in i128 and rounded up to nano precision like
//! the Go implementation; quantities beyond i128 are rejected.

use serde_json::Value;

use super::status::Cause;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    BinarySi,
    DecimalSi,
    DecimalExponent,
}

const DECIMAL: [(&str, i32); 10] =
    [("n", -9), ("u", -6), ("m", -3), ("", 0), ("k", 3), ("M", 6), ("G", 9), ("T", 12), ("P", 15), ("E", 18)];
const BINARY: [(&str, u32); 6] = [("Ki", 1), ("Mi", 2), ("Gi", 3), ("Ti", 4), ("Pi", 5), ("Ei", 6)];

/// Parses a quantity string into (mantissa, scale, format).
fn parse(s: &str) -> Option<(i128, i32, Format)> {
    let (negative, rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    let digits = format!("{int_part}{frac_part}");
    let mut mantissa: i128 = if digits.is_empty() { 0 } else { digits.parse().ok()? };
    let mut scale = -i32::try_from(frac_part.len()).ok()?;
    let format = if let Some((_, power)) = BINARY.iter().find(|(sfx, _)| *sfx == suffix) {
        mantissa = mantissa.checked_mul(1024_i128.checked_pow(*power)?)?;
        Format::BinarySi
    } else if let Some((_, exp)) = DECIMAL.iter().find(|(sfx, _)| *sfx == suffix) {
        scale += exp;
        Format::DecimalSi
    } else if let Some(exp) = suffix.strip_prefix(['e', 'E']) {
        scale += exp.parse::<i32>().ok()?;
        Format::DecimalExponent
    } else {
        return None;
    };
    if negative {
        mantissa = -mantissa;
    }
    // Round up (away from zero) to nano precision, like inf.RoundUp.
    if scale < -9 {
        let divisor = 10_i128.checked_pow((-9 - scale).unsigned_abs())?;
        let rounded = mantissa / divisor;
        mantissa = if mantissa % divisor == 0 { rounded } else { rounded + mantissa.signum() };
        scale = -9;
    }
    Some((mantissa, scale, format))
}

/// The quantity as a whole number, rounded up as Go's `Quantity.Value()` does (the API
/// server's request-policy checks use it), or `None` if it does not parse.
pub fn value(s: &str) -> Option<i128> {
    let (mantissa, scale, _) = parse(s)?;
    if scale >= 0 {
        return mantissa.checked_mul(10_i128.checked_pow(scale.unsigned_abs())?);
    }
    let divisor = 10_i128.checked_pow(scale.unsigned_abs())?;
    let whole = mantissa / divisor;
    Some(if mantissa % divisor > 0 { whole + 1 } else { whole })
}

/// The canonical string of a quantity, or `None` if it does not parse.
pub fn canonical(s: &str) -> Option<String> {
    let (mut mantissa, mut scale, mut format) = parse(s.trim())?;
    if mantissa == 0 {
        return Some("0".to_owned());
    }
    // The integer value, when the quantity is one.
    let integer = if scale >= 0 {
        10_i128.checked_pow(scale.unsigned_abs()).and_then(|p| mantissa.checked_mul(p))
    } else {
        let divisor = 10_i128.checked_pow(scale.unsigned_abs())?;
        (mantissa % divisor == 0).then(|| mantissa / divisor)
    };
    if format == Format::BinarySi {
        match integer {
            Some(v) if v.abs() >= 1024 => {
                let (mut amount, mut times) = (v, 0);
                while amount % 1024 == 0 && times < 6 {
                    amount /= 1024;
                    times += 1;
                }
                let suffix = if times == 0 { "" } else { BINARY[times - 1].0 };
                return Some(format!("{amount}{suffix}"));
            }
            _ => format = Format::DecimalSi,
        }
    }
    while mantissa % 10 == 0 {
        mantissa /= 10;
        scale += 1;
    }
    match scale % 3 {
        1 | -2 => {
            mantissa *= 10;
            scale -= 1;
        }
        2 | -1 => {
            mantissa *= 100;
            scale -= 2;
        }
        _ => {}
    }
    let suffix = match format {
        Format::DecimalSi => match DECIMAL.iter().find(|(_, exp)| *exp == scale) {
            Some((sfx, _)) => (*sfx).to_owned(),
            None => format!("e{scale}"),
        },
        _ if scale == 0 => String::new(),
        _ => format!("e{scale}"),
    };
    Some(format!("{mantissa}{suffix}"))
}

/// Canonicalizes every quantity of a v1 ResourceSlice in place; unparsable ones become
/// Invalid causes.
pub fn canonicalize_slice(object: &mut Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let mut fix = |value: &mut Value, field: String| {
        if let Some(raw) = value.as_str() {
            match canonical(raw) {
                Some(c) => *value = Value::String(c),
                None => causes.push(Cause {
                    reason: "FieldValueInvalid",
                    field,
                    message: format!(
                        "Invalid value: \"{raw}\": quantities must match the regular expression \
                         '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
                    ),
                }),
            }
        }
    };
    if let Some(devices) = object.pointer_mut("/spec/devices").and_then(Value::as_array_mut) {
        for (i, device) in devices.iter_mut().enumerate() {
            if let Some(capacity) = device.get_mut("capacity").and_then(Value::as_object_mut) {
                for (key, cap) in capacity.iter_mut() {
                    let field = format!("spec.devices[{i}].capacity[{key}]");
                    if let Some(v) = cap.get_mut("value") {
                        fix(v, format!("{field}.value"));
                    }
                    if let Some(policy) = cap.get_mut("requestPolicy") {
                        if let Some(v) = policy.get_mut("default") {
                            fix(v, format!("{field}.requestPolicy.default"));
                        }
                        for (n, v) in policy
                            .get_mut("validValues")
                            .and_then(Value::as_array_mut)
                            .into_iter()
                            .flatten()
                            .enumerate()
                        {
                            fix(v, format!("{field}.requestPolicy.validValues[{n}]"));
                        }
                        for bound in ["min", "max", "step"] {
                            if let Some(v) = policy.pointer_mut(&format!("/validRange/{bound}")) {
                                fix(v, format!("{field}.requestPolicy.validRange.{bound}"));
                            }
                        }
                    }
                }
            }
            for (n, consumed) in
                device.get_mut("consumesCounters").and_then(Value::as_array_mut).into_iter().flatten().enumerate()
            {
                for (key, counter) in consumed.get_mut("counters").and_then(Value::as_object_mut).into_iter().flatten()
                {
                    if let Some(v) = counter.get_mut("value") {
                        fix(v, format!("spec.devices[{i}].consumesCounters[{n}].counters[{key}].value"));
                    }
                }
            }
        }
    }
    for (n, set) in
        object.pointer_mut("/spec/sharedCounters").and_then(Value::as_array_mut).into_iter().flatten().enumerate()
    {
        for (key, counter) in set.get_mut("counters").and_then(Value::as_object_mut).into_iter().flatten() {
            if let Some(v) = counter.get_mut("value") {
                fix(v, format!("spec.sharedCounters[{n}].counters[{key}].value"));
            }
        }
    }
    causes
}
