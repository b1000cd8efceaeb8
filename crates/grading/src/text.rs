//! Text helpers shared by the lexical strategies: whitespace normalisation, safe truncation for
//! details, and building author-supplied regexes with limits.

use std::borrow::Cow;

use regex::{Regex, RegexBuilder, RegexSet, RegexSetBuilder};
use serde_json::Value;

use skilleval_model::text::truncate;
use skilleval_schema::{REGEX_DFA_SIZE_LIMIT, REGEX_SIZE_LIMIT};

/// Longest text copied into a grade's details; the output itself is stored with the result.
pub(crate) const DETAILS_TEXT_LIMIT: usize = 4096;

/// Builds an author-supplied regex with size limits.
pub(crate) fn user_regex(pattern: &str, case_insensitive: bool) -> Result<Regex, regex::Error> {
    RegexBuilder::new(pattern)
        .case_insensitive(case_insensitive)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_DFA_SIZE_LIMIT)
        .build()
}

/// Builds a set of regexes (all matched in one pass) with size limits.
pub(crate) fn user_regex_set<I, S>(
    patterns: I,
    case_insensitive: bool,
) -> Result<RegexSet, regex::Error>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    RegexSetBuilder::new(patterns)
        .case_insensitive(case_insensitive)
        .size_limit(REGEX_SIZE_LIMIT * 4)
        .dfa_size_limit(REGEX_DFA_SIZE_LIMIT * 2)
        .build()
}

/// A regex matching `term` literally, as a whole word when `whole_word` is set. Word boundaries
/// are only required at ends that are word characters (so `C++` still matches in `C++ code`),
/// and any run of whitespace in the term matches any run of whitespace in the text.
pub(crate) fn term_pattern(term: &str, whole_word: bool) -> String {
    keyword_pattern(term, whole_word, true)
}

/// [`term_pattern`], with whitespace normalisation a choice: when `normalize_whitespace` is
/// false the term's inner whitespace must appear in the text exactly as written.
pub(crate) fn keyword_pattern(term: &str, whole_word: bool, normalize_whitespace: bool) -> String {
    let term = term.trim();
    let body = if normalize_whitespace {
        let escaped: Vec<String> = term.split_whitespace().map(regex::escape).collect();
        escaped.join(r"\s+")
    } else {
        regex::escape(term)
    };
    if !whole_word {
        return body;
    }
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let start = if term.chars().next().is_some_and(is_word) {
        r"\b"
    } else {
        ""
    };
    let end = if term.chars().next_back().is_some_and(is_word) {
        r"\b"
    } else {
        ""
    };
    format!("{start}{body}{end}")
}

/// Collapses every run of whitespace into one space and trims the ends.
pub(crate) fn collapse_whitespace(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for word in s.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

/// `s` prepared for comparison: trimmed, whitespace collapsed and lower-cased as asked.
/// Borrows when nothing changes.
pub(crate) fn prepare(s: &str, case_sensitive: bool, normalize_whitespace: bool) -> Cow<'_, str> {
    let s = s.trim();
    let s: Cow<'_, str> = if normalize_whitespace && needs_collapse(s) {
        Cow::Owned(collapse_whitespace(s))
    } else {
        Cow::Borrowed(s)
    };
    if case_sensitive || !has_uppercase(&s) {
        s
    } else {
        Cow::Owned(s.to_lowercase())
    }
}

fn needs_collapse(s: &str) -> bool {
    let mut prev_space = false;
    for c in s.chars() {
        if c.is_whitespace() {
            if prev_space || c != ' ' {
                return true;
            }
            prev_space = true;
        } else {
            prev_space = false;
        }
    }
    false
}

/// Whether lower-casing `s` would change it.
pub(crate) fn has_uppercase(s: &str) -> bool {
    if s.is_ascii() {
        s.bytes().any(|b| b.is_ascii_uppercase())
    } else {
        // Lower-casing may change more than upper-case letters (e.g. title case); be exact.
        s.chars()
            .any(|c| c.to_lowercase().next() != Some(c) || c.to_lowercase().count() != 1)
    }
}

/// `s` as a details string, cut at [`DETAILS_TEXT_LIMIT`] with a marker.
pub(crate) fn details_text(s: &str) -> Value {
    let (head, cut) = truncate(s, DETAILS_TEXT_LIMIT);
    if cut {
        Value::String(format!("{head}… [{} bytes total]", s.len()))
    } else {
        Value::String(head.to_string())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use super::*;

    #[test]
    fn prepare_trims_collapses_and_lowercases() {
        assert_eq!(prepare("  Hello   World \n", true, true), "Hello World");
        assert_eq!(prepare("  Hello   World \n", false, true), "hello world");
        assert_eq!(prepare(" Hello\tWorld ", true, false), "Hello\tWorld");
        assert_eq!(prepare("NAÏVE Café", false, false), "naïve café");
        assert!(matches!(
            prepare("already fine", false, true),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn term_pattern_bounds_only_word_ends() {
        let re = user_regex(&term_pattern("C++", true), false).unwrap();
        assert!(re.is_match("I like C++ code"));
        let re = user_regex(&term_pattern("cat", true), false).unwrap();
        assert!(!re.is_match("concatenate"));
        assert!(re.is_match("the cat sat"));
        let re = user_regex(&term_pattern("machine learning", true), false).unwrap();
        assert!(re.is_match("machine\n  learning"));
    }
}
