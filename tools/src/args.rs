//! A tiny `--name value` command-line parser (the tools have few flags; no
//! parser dependency needed). Every flag must be consumed: [`Flags::finish`]
//! rejects the ones nobody asked for, so a typo is an error, not a default.

use crate::ToolError;
use std::collections::BTreeMap;
use std::str::FromStr;

#[derive(Debug)]
pub struct Flags {
    values: BTreeMap<String, String>,
}

impl Flags {
    /// Parses `--name value` pairs.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, ToolError> {
        let mut values = BTreeMap::new();
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            let name = arg
                .strip_prefix("--")
                .filter(|n| !n.is_empty())
                .ok_or_else(|| ToolError::Usage(format!("expected --flag, got {arg:?}")))?;
            let value = it.next().ok_or_else(|| ToolError::Usage(format!("--{name} needs a value")))?;
            if values.insert(name.to_string(), value).is_some() {
                return Err(ToolError::Usage(format!("--{name} given twice")));
            }
        }
        Ok(Self { values })
    }

    /// The flag's value, if given.
    pub fn optional<T: FromStr>(&mut self, name: &str) -> Result<Option<T>, ToolError> {
        match self.values.remove(name) {
            None => Ok(None),
            Some(v) => {
                v.parse().map(Some).map_err(|_| ToolError::Usage(format!("--{name}: cannot parse {v:?}")))
            }
        }
    }

    /// The flag's value, or `default`.
    pub fn or<T: FromStr>(&mut self, name: &str, default: T) -> Result<T, ToolError> {
        Ok(self.optional(name)?.unwrap_or(default))
    }

    /// The flag's value; an error when missing.
    pub fn required<T: FromStr>(&mut self, name: &str) -> Result<T, ToolError> {
        self.optional(name)?.ok_or_else(|| ToolError::Usage(format!("--{name} is required")))
    }

    /// Fails if a flag was given that no one asked for.
    pub fn finish(self) -> Result<(), ToolError> {
        match self.values.keys().next() {
            None => Ok(()),
            Some(name) => Err(ToolError::Usage(format!("unknown flag --{name}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(s: &str) -> Result<Flags, ToolError> {
        Flags::parse(s.split_whitespace().map(String::from))
    }

    #[test]
    fn parses_values_defaults_and_rejects_leftovers() {
        let mut f = flags("--concurrency 8 --api http://x").unwrap();
        assert_eq!(f.required::<usize>("concurrency").unwrap(), 8);
        assert_eq!(f.or("duration-secs", 30u64).unwrap(), 30);
        let err = f.finish().unwrap_err();
        assert_eq!(err.to_string(), "unknown flag --api");
    }

    #[test]
    fn rejects_malformed_command_lines() {
        assert!(flags("concurrency 8").is_err());
        assert!(flags("--concurrency").is_err());
        assert!(flags("--a 1 --a 2").is_err());
        let mut f = flags("--concurrency eight").unwrap();
        assert_eq!(
            f.required::<usize>("concurrency").unwrap_err().to_string(),
            "--concurrency: cannot parse \"eight\""
        );
        assert!(f.required::<usize>("missing").is_err());
    }
}
