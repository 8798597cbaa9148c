//! Prompt datasets: JSONL of `{"id", "prompt"}` or Spec-Bench's
//! `{"question_id", "category", "turns"}`, filtered by category, sampled per category and limited.
use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use super::config::DatasetConfig;
use crate::error::{Error, Result};

/// One prompt of a dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// `id` or `question_id`, as text.
    pub id: String,
    /// Spec-Bench category (or an optional `category` of the simple format).
    pub category: Option<String>,
    /// The user turns; the runner uses the first.
    pub turns: Vec<String>,
}

/// Reads the prompts `config` selects: blank lines are skipped, the `categories` filter is
/// applied, then `per_category`, then `limit`. A malformed line is an error naming the file
/// and the line number; so is a filter that leaves no prompt, and `per_category` over a
/// prompt without a category.
pub fn load_prompts(config: &DatasetConfig) -> Result<Vec<Prompt>> {
    let path = &config.path;
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut all = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let prompt = parse_line(line, i + 1)
            .map_err(|why| Error::invalid(format!("{} line {}: {why}", path.display(), i + 1)))?;
        all.push(prompt);
    }
    let mut prompts = match &config.categories {
        Some(wanted) => {
            check_categories(path, &all, wanted)?;
            all.into_iter()
                .filter(|p| p.category.as_ref().is_some_and(|c| wanted.contains(c)))
                .collect()
        }
        None => all,
    };
    if let Some(per) = config.per_category {
        prompts = first_of_each_category(path, prompts, per)?;
    }
    if let Some(limit) = config.limit {
        prompts.truncate(limit);
    }
    if prompts.is_empty() {
        return Err(Error::invalid(format!(
            "{}: no prompts (the file is empty or the filters removed every line)",
            path.display()
        )));
    }
    Ok(prompts)
}

/// How `config` selected its prompts from the file, for a summary's header: empty when every
/// prompt was taken, else e.g. ` (categories coding, math; 2 per category; the first 3)`.
pub fn selection(config: &DatasetConfig) -> String {
    let mut parts = Vec::new();
    if let Some(categories) = &config.categories {
        parts.push(format!("categories {}", categories.join(", ")));
    }
    if let Some(per) = config.per_category {
        parts.push(format!("{per} per category"));
    }
    if let Some(limit) = config.limit {
        parts.push(format!("the first {limit}"));
    }
    match parts.is_empty() {
        true => String::new(),
        false => format!(" ({})", parts.join("; ")),
    }
}

/// The first `per` prompts of each category, in file order.
fn first_of_each_category(path: &Path, prompts: Vec<Prompt>, per: usize) -> Result<Vec<Prompt>> {
    let mut taken: HashMap<String, usize> = HashMap::new();
    let mut kept = Vec::new();
    for p in prompts {
        let Some(category) = &p.category else {
            return Err(Error::invalid(format!(
                "dataset.per_category: prompt {:?} of {} has no category",
                p.id,
                path.display()
            )));
        };
        let n = taken.entry(category.clone()).or_insert(0);
        if *n < per {
            *n += 1;
            kept.push(p);
        }
    }
    Ok(kept)
}

/// Every wanted category must occur in the file (a typo would silently select nothing).
fn check_categories(path: &Path, all: &[Prompt], wanted: &[String]) -> Result<()> {
    let mut present: Vec<&str> = all.iter().filter_map(|p| p.category.as_deref()).collect();
    present.sort_unstable();
    present.dedup();
    for w in wanted {
        if !present.contains(&w.as_str()) {
            return Err(Error::invalid(format!(
                "dataset.categories: {w:?} does not occur in {}; present: {}",
                path.display(),
                if present.is_empty() {
                    "none".to_string()
                } else {
                    present.join(", ")
                }
            )));
        }
    }
    Ok(())
}

/// One JSONL line, either format. `number` (1-based) is the default id of the simple format.
fn parse_line(line: &str, number: usize) -> std::result::Result<Prompt, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not valid JSON: {e}"))?;
    let obj = value.as_object().ok_or("expected a JSON object")?;
    let text_of = |key: &str| -> std::result::Result<Option<String>, String> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(_) => Err(format!("`{key}` must be a string or a number")),
        }
    };
    let category = match obj.get("category") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("`category` must be a string".into()),
    };
    if let Some(turns) = obj.get("turns") {
        let turns: Vec<String> = turns
            .as_array()
            .filter(|a| !a.is_empty())
            .and_then(|a| a.iter().map(|t| t.as_str().map(String::from)).collect())
            .ok_or("`turns` must be a non-empty list of strings")?;
        let id = text_of("question_id")?.ok_or("Spec-Bench lines need a `question_id`")?;
        return Ok(Prompt {
            id,
            category,
            turns,
        });
    }
    let prompt = match obj.get("prompt") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err("`prompt` must be a string".into()),
        None => {
            return Err(
                "expected {\"id\", \"prompt\"} or Spec-Bench's {\"question_id\", \"category\", \"turns\"}".into(),
            )
        }
    };
    let id = text_of("id")?.unwrap_or_else(|| number.to_string());
    Ok(Prompt {
        id,
        category,
        turns: vec![prompt],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_formats_parse() {
        let simple = parse_line(r#"{"id": "a", "prompt": "def f("}"#, 1).unwrap();
        assert_eq!(simple.id, "a");
        assert_eq!(simple.turns, vec!["def f(".to_string()]);
        let bench = parse_line(
            r#"{"question_id": 81, "category": "writing", "turns": ["x", "y"]}"#,
            2,
        )
        .unwrap();
        assert_eq!(bench.id, "81");
        assert_eq!(bench.category.as_deref(), Some("writing"));
        assert_eq!(bench.turns.len(), 2);
        assert!(parse_line(r#"{"text": "x"}"#, 3).is_err());
        assert!(parse_line("{", 3).is_err());
    }
}
