//! The glob the rustdoc describes, written plainly as the fuzz checks'
//! reference: `*` any run of characters, `?` one character. Shared by the
//! key pattern and identity URL checks, which both match globs.

/// Whether `text` matches `pattern`, by dynamic programming over prefixes.
pub fn glob(pattern: &[char], text: &[char]) -> bool {
    let mut row = vec![false; text.len() + 1];
    row[0] = true;
    for &p in pattern {
        let mut next = vec![false; text.len() + 1];
        if p == '*' {
            next[0] = row[0];
        }
        for j in 1..=text.len() {
            next[j] = match p {
                '*' => next[j - 1] || row[j],
                '?' => row[j - 1],
                c => row[j - 1] && text[j - 1] == c,
            };
        }
        row = next;
    }
    row[text.len()]
}
