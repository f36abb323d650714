//! The set of profiles a run chooses from: kiln's built-in ones, plus or replaced by the
//! user's.

use std::path::Path;

use crate::matching::{ProfileMatch, best_match};
use crate::{Origin, Profile, ProfileError};

/// All known profiles, validated and free of ambiguous patterns.
#[derive(Debug, Clone)]
pub struct ProfileSet {
    profiles: Vec<Profile>,
}

impl ProfileSet {
    /// kiln's built-in profiles (embedded from the repository's `profiles/`).
    pub fn builtin() -> Result<ProfileSet, ProfileError> {
        let profiles = crate::builtin::BUILTIN
            .iter()
            .map(|(file, text)| Profile::parse(text, Origin::BuiltIn((*file).to_owned())))
            .collect::<Result<Vec<_>, _>>()?;
        Self::from_profiles(profiles)
    }

    /// The built-in profiles, then every `*.toml` in `dir`: a user profile with a built-in
    /// one's name replaces it, any other is added.
    pub fn with_user_dir(dir: &Path) -> Result<ProfileSet, ProfileError> {
        let builtin = Self::builtin()?;
        let user_dir_error = |e: std::io::Error| ProfileError::UserDir {
            dir: dir.to_path_buf(),
            message: e.to_string(),
        };
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .map_err(user_dir_error)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect();
        paths.sort();
        let mut user = Vec::new();
        for path in paths {
            let text = std::fs::read_to_string(&path).map_err(user_dir_error)?;
            user.push(Profile::parse(&text, Origin::User(path))?);
        }
        let mut profiles: Vec<Profile> = builtin
            .profiles
            .into_iter()
            .filter(|b| !user.iter().any(|u| u.name == b.name))
            .collect();
        profiles.extend(user);
        Self::from_profiles(profiles)
    }

    /// Checks names are unique and no two profiles share a pattern.
    pub fn from_profiles(mut profiles: Vec<Profile>) -> Result<ProfileSet, ProfileError> {
        profiles.sort_by(|a, b| a.name.cmp(&b.name));
        for (i, a) in profiles.iter().enumerate() {
            for b in &profiles[i + 1..] {
                if a.name == b.name {
                    return Err(ProfileError::DuplicateName {
                        name: a.name.clone(),
                        first: a.origin.to_string(),
                        second: b.origin.to_string(),
                    });
                }
                for pa in &a.patterns {
                    if let Some(pb) = b.patterns.iter().find(|pb| pb.tokens == pa.tokens) {
                        return Err(ProfileError::AmbiguousPattern {
                            pattern: pb.text.clone(),
                            first: a.name.clone(),
                            second: b.name.clone(),
                        });
                    }
                }
            }
        }
        Ok(ProfileSet { profiles })
    }

    /// Every profile, sorted by name.
    pub fn all(&self) -> &[Profile] {
        &self.profiles
    }

    /// The profile named `name`, or an error listing the known ones (with a suggestion).
    pub fn get(&self, name: &str) -> Result<&Profile, ProfileError> {
        let wanted = name.trim().to_ascii_lowercase();
        if let Some(p) = self.profiles.iter().find(|p| p.name == wanted) {
            return Ok(p);
        }
        let names: Vec<&str> = self.profiles.iter().map(|p| p.name.as_str()).collect();
        let best = names
            .iter()
            .map(|n| edit_distance(&wanted, n))
            .min()
            .unwrap_or(usize::MAX);
        let close: Vec<String> = names
            .iter()
            .filter(|n| best <= 2 && edit_distance(&wanted, n) == best)
            .map(|n| format!("`{n}`"))
            .collect();
        let suggestion = if close.is_empty() {
            String::new()
        } else {
            format!(" (did you mean {}?)", close.join(" or "))
        };
        Err(ProfileError::Unknown {
            name: name.to_owned(),
            suggestion,
            known: names.join(", "),
        })
    }

    /// The profile for an NVML GPU name, if one matches (only CUDA profiles carry patterns).
    pub fn match_gpu(&self, gpu_name: &str) -> Result<Option<ProfileMatch<'_>>, ProfileError> {
        best_match(&self.profiles, gpu_name)
    }
}

/// Levenshtein distance, for "did you mean" suggestions.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}
