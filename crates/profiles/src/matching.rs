//! Matching NVML GPU names to profiles.
//!
//! Names and patterns are split into lowercase alphanumeric tokens ("NVIDIA A100-SXM4-80GB" →
//! `nvidia a100 sxm4 80gb`). A pattern matches when its tokens appear consecutively among the
//! name's, so `A10` matches "NVIDIA A10" and "NVIDIA A10G"'s own pattern `A10G`, but never
//! "NVIDIA A100"; `L40S` never matches an "L40". Precedence: the pattern with more tokens wins
//! (specific beats generic); equally specific matches in two profiles are an error, never a guess.

use crate::{Profile, ProfileError};

/// A name pattern and its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    pub text: String,
    pub tokens: Vec<String>,
}

impl Pattern {
    fn matches(&self, name_tokens: &[String]) -> bool {
        name_tokens
            .windows(self.tokens.len())
            .any(|w| w == self.tokens.as_slice())
    }
}

/// Splits a GPU name or pattern into lowercase alphanumeric tokens.
pub fn tokenize(s: &str) -> Vec<String> {
    s.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_ascii_lowercase)
        .collect()
}

/// A GPU name matched to a profile, and by which pattern.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProfileMatch<'a> {
    pub profile: &'a Profile,
    pub pattern: &'a str,
}

/// The best match for `gpu_name` among `profiles` (see the module docs for precedence).
pub(crate) fn best_match<'a>(
    profiles: &'a [Profile],
    gpu_name: &str,
) -> Result<Option<ProfileMatch<'a>>, ProfileError> {
    let name = tokenize(gpu_name);
    let mut best: Option<(usize, ProfileMatch<'a>)> = None;
    for profile in profiles {
        for pattern in &profile.patterns {
            if !pattern.matches(&name) {
                continue;
            }
            let candidate = ProfileMatch {
                profile,
                pattern: &pattern.text,
            };
            let specificity = pattern.tokens.len();
            match &best {
                Some((s, _)) if *s > specificity => {}
                Some((s, current)) if *s == specificity && current.profile.name != profile.name => {
                    return Err(ProfileError::AmbiguousMatch {
                        gpu: gpu_name.to_owned(),
                        first: current.profile.name.clone(),
                        first_pattern: current.pattern.to_owned(),
                        second: profile.name.clone(),
                        second_pattern: pattern.text.clone(),
                    });
                }
                Some((s, _)) if *s == specificity => {}
                _ => best = Some((specificity, candidate)),
            }
        }
    }
    Ok(best.map(|(_, m)| m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_into_lowercase_tokens() {
        assert_eq!(
            tokenize("NVIDIA A100-SXM4-80GB"),
            ["nvidia", "a100", "sxm4", "80gb"]
        );
        assert_eq!(
            tokenize("NVIDIA GeForce RTX 4090"),
            ["nvidia", "geforce", "rtx", "4090"]
        );
        assert_eq!(tokenize("  --  "), Vec::<String>::new());
    }

    #[test]
    fn patterns_match_whole_consecutive_tokens() {
        let p = |t: &str| Pattern {
            text: t.into(),
            tokens: tokenize(t),
        };
        assert!(p("RTX 4090").matches(&tokenize("NVIDIA GeForce RTX 4090")));
        assert!(!p("RTX 4090").matches(&tokenize("NVIDIA GeForce RTX 4080")));
        assert!(!p("A10").matches(&tokenize("NVIDIA A100-PCIE-40GB")));
        assert!(!p("L40S").matches(&tokenize("NVIDIA L40")));
        assert!(!p("4090 RTX").matches(&tokenize("NVIDIA GeForce RTX 4090")));
    }
}
