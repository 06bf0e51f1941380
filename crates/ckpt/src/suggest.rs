//! Suggestions for a misspelled key or normalizer name: the nearest
//! existing names by edit distance.

/// Up to three of `candidates` nearest to `name` by edit distance (only
/// those within half of `name`'s length): what a misspelling most likely meant.
pub(crate) fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut scored: Vec<(usize, &str)> = candidates.map(|c| (edit_distance(name, c), c)).collect();
    scored.sort();
    let Some(&(best, _)) = scored.first() else { return Vec::new() };
    let limit = (name.chars().count().max(4) / 2).min(best + 2);
    scored.into_iter().filter(|(d, _)| *d <= limit).take(3).map(|(_, c)| c.to_owned()).collect()
}

/// Levenshtein distance over chars, in O(|a|·|b|) time and O(|b|) memory.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let up = row[j + 1];
            row[j + 1] = (up + 1).min(row[j] + 1).min(diag + usize::from(ca != cb));
            diag = up;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::{closest, edit_distance};

    #[test]
    fn edit_distance_counts_single_character_edits() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }

    #[test]
    fn closest_names_are_the_near_misses_only() {
        let groups =
            ["model._actor.mu.norm.running_obs_norm", "model._critic.norm.running_obs_norm", "running_reward_norm"];
        let got = closest("model._actor.mu.norm.runing_obs_norm", groups.iter().copied());
        assert_eq!(got, ["model._actor.mu.norm.running_obs_norm"]);
        assert!(closest("something.else.entirely", groups.iter().copied()).is_empty());
    }
}
