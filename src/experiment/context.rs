//! Refuses runs whose prompts plus `max_new_tokens` do not fit a model's context.
use std::path::Path;

use super::config::{DrafterKind, ExperimentConfig};
use super::runner::EncodedPrompt;
use crate::error::{Error, Result};

/// A model's context length as its `config.json` states it: `max_position_embeddings`, at the
/// top level or in `text_config` (multimodal Gemma 3); a GGUF file's `{arch}.context_length`;
/// `None` when the model states none.
pub fn context_limit(model_dir: &Path) -> Result<Option<usize>> {
    if crate::gguf::is_gguf(model_dir) {
        let file = crate::gguf::GgufFile::open(model_dir)?;
        let arch = file
            .str("general.architecture")?
            .unwrap_or_default()
            .to_string();
        let key = format!("{arch}.context_length");
        return Ok(file
            .u64(&key)?
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX)));
    }
    let path = model_dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
    let key = "max_position_embeddings";
    let value = json
        .get(key)
        .or_else(|| json.get("text_config").and_then(|t| t.get(key)));
    match value {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| Error::invalid(format!("{}: {key} = {v}: not a count", path.display()))),
    }
}

/// Checks every prompt against the target's and each used draft model's context: a prompt
/// whose tokens plus `max_new_tokens` pass a model's `max_position_embeddings` would run
/// positions the model was never trained for. The error names each model, its limit and the
/// longest prompt that does not fit, and how many do not.
pub fn check_context(config: &ExperimentConfig, prompts: &[EncodedPrompt]) -> Result<()> {
    let mut models = vec![("the target".to_string(), config.target.path.clone())];
    for name in config.used_drafters() {
        if let Some(d) = config.drafters.get(name) {
            if let (DrafterKind::Model, Some(path)) = (d.kind, &d.path) {
                models.push((format!("draft model `{name}`"), path.clone()));
            }
        }
    }
    let mut problems = Vec::new();
    for (who, dir) in &models {
        let Some(limit) = context_limit(dir)? else {
            continue;
        };
        let over: Vec<&EncodedPrompt> = prompts
            .iter()
            .filter(|p| p.tokens.len() + config.max_new_tokens > limit)
            .collect();
        let Some(longest) = over.iter().max_by_key(|p| p.tokens.len()) else {
            continue;
        };
        problems.push(format!(
            "prompt {:?} ({} tokens) + max_new_tokens {} = {} positions exceeds \
             max_position_embeddings = {limit} of {who} ({}){}",
            longest.id,
            longest.tokens.len(),
            config.max_new_tokens,
            longest.tokens.len() + config.max_new_tokens,
            dir.join("config.json").display(),
            match over.len() {
                1 => String::new(),
                n => format!("; {n} prompts do not fit"),
            }
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{}\nlower max_new_tokens, shorten or leave out the prompts (dataset.limit), or use a \
             model with a longer context",
            problems.join("\n")
        )))
    }
}
