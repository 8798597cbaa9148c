//! Prompt encoding, optionally through the model's chat template (a Jinja template from
//! `chat_template.jinja` or `tokenizer_config.json`'s `chat_template`).
use std::path::{Path, PathBuf};

use minijinja::{context, Environment, ErrorKind};
use serde_json::Value;
use tokenizers::Tokenizer;

use super::dataset::Prompt;
use crate::error::{Error, Result};

/// A model's chat template with the special tokens it refers to.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
    /// The file the template came from (for messages).
    pub origin: PathBuf,
}

impl ChatTemplate {
    /// Reads the template of the model at `dir`: a GGUF file's `tokenizer.chat_template`;
    /// in a directory, `chat_template.jinja` if present, else the
    /// `chat_template` key of `tokenizer_config.json` (a string, or a list of named templates
    /// of which `default` is used). Fails when there is none or it does not compile.
    pub fn load(dir: &Path) -> Result<Self> {
        if crate::gguf::is_gguf(dir) {
            return Self::from_gguf(dir);
        }
        let config_path = dir.join("tokenizer_config.json");
        let config: Value = match std::fs::read_to_string(&config_path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| {
                Error::invalid(format!("{}: not valid JSON: {e}", config_path.display()))
            })?,
            Err(_) => Value::Null,
        };
        let jinja_path = dir.join("chat_template.jinja");
        let (source, origin) = if jinja_path.is_file() {
            let text =
                std::fs::read_to_string(&jinja_path).map_err(|e| Error::io(&jinja_path, e))?;
            (text, jinja_path)
        } else {
            let source = template_in_config(&config).ok_or_else(|| {
                Error::invalid(format!(
                    "dataset.chat_template = true, but {} has no chat template (looked for chat_template.jinja and the chat_template key of tokenizer_config.json)",
                    dir.display()
                ))
            })?;
            (source, config_path)
        };
        let template = Self {
            source,
            bos_token: special_token(&config, "bos_token"),
            eos_token: special_token(&config, "eos_token"),
            origin,
        };
        template
            .environment()
            .template_from_str(&template.source)
            .map_err(|e| template.error(e))?;
        Ok(template)
    }

    /// The template of a GGUF file (`tokenizer.chat_template`), its BOS and EOS tokens named
    /// by `tokenizer.ggml.bos_token_id`/`eos_token_id`.
    fn from_gguf(path: &Path) -> Result<Self> {
        let file = crate::gguf::GgufFile::open(path)?;
        let source = crate::gguf::tokenizer::chat_template(&file)?.ok_or_else(|| {
            Error::invalid(format!(
                "dataset.chat_template = true, but {} has no chat template (no `tokenizer.chat_template` in its metadata)",
                path.display()
            ))
        })?;
        let tokens = file.array("tokenizer.ggml.tokens")?.unwrap_or_default();
        let token = |key: &str| -> Result<String> {
            Ok(file
                .u64(key)?
                .and_then(|id| tokens.get(usize::try_from(id).ok()?))
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string())
        };
        let template = Self {
            source,
            bos_token: token("tokenizer.ggml.bos_token_id")?,
            eos_token: token("tokenizer.ggml.eos_token_id")?,
            origin: path.to_path_buf(),
        };
        template
            .environment()
            .template_from_str(&template.source)
            .map_err(|e| template.error(e))?;
        Ok(template)
    }

    /// Renders a conversation of one user turn with the generation prompt appended.
    pub fn render(&self, user_turn: &str) -> Result<String> {
        self.render_conversation(&[user_turn.to_string()])
    }

    /// Renders a conversation of alternating turns — user, assistant, user, … — with the
    /// generation prompt appended.
    pub fn render_conversation(&self, turns: &[String]) -> Result<String> {
        let messages: Vec<_> = turns
            .iter()
            .enumerate()
            .map(|(i, content)| {
                let role = if i % 2 == 0 { "user" } else { "assistant" };
                context! { role => role, content => content }
            })
            .collect();
        self.environment()
            .render_str(
                &self.source,
                context! {
                    messages => messages,
                    add_generation_prompt => true,
                    bos_token => &self.bos_token,
                    eos_token => &self.eos_token,
                },
            )
            .map_err(|e| self.error(e))
    }

    /// Jinja as transformers configures it: trimmed blocks, Python string methods,
    /// `raise_exception`. `strftime_now` is deliberately left undefined so templates that
    /// print today's date (Llama 3.1) fall back to their fixed date and prompts stay
    /// reproducible.
    fn environment(&self) -> Environment<'static> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env
    }

    fn error(&self, e: minijinja::Error) -> Error {
        Error::invalid(format!("chat template of {}: {e}", self.origin.display()))
    }
}

fn template_in_config(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(String::from)),
        _ => None,
    }
}

/// A special token of tokenizer_config.json, written as a string or as `{"content": ...}`.
fn special_token(config: &Value, key: &str) -> String {
    match config.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

/// The tokens of `prompt`'s first turn: rendered through `template` when given and encoded
/// without special tokens (the template writes them); raw text is encoded as transformers'
/// `tokenizer(text)` does, with the special tokens the tokenizer adds itself (Gemma's BOS).
pub fn encode_prompt(
    tokenizer: &Tokenizer,
    prompt: &Prompt,
    template: Option<&ChatTemplate>,
) -> Result<Vec<u32>> {
    let turn = prompt.turns.first().map(String::as_str).unwrap_or_default();
    let (text, special) = match template {
        Some(t) => (t.render(turn)?, false),
        None => (turn.to_string(), true),
    };
    let encoding = tokenizer
        .encode(text, special)
        .map_err(|e| Error::invalid(format!("prompt {}: cannot encode: {e}", prompt.id)))?;
    let ids = encoding.get_ids().to_vec();
    if ids.is_empty() {
        return Err(Error::invalid(format!(
            "prompt {}: encodes to no tokens (empty prompt)",
            prompt.id
        )));
    }
    Ok(ids)
}

/// The tokens of a conversation — user, assistant, user, …, ending with a user turn — as the
/// prompt of the next answer: through `template` when given, else the plain text the model
/// continued (each answer right after its question, a blank line before each later question).
pub fn encode_conversation(
    tokenizer: &Tokenizer,
    id: &str,
    turns: &[String],
    template: Option<&ChatTemplate>,
) -> Result<Vec<u32>> {
    let text = match template {
        Some(t) => t.render_conversation(turns)?,
        None => turns
            .iter()
            .enumerate()
            .map(|(i, t)| match i {
                0 => t.clone(),
                i if i % 2 == 0 => format!("\n\n{t}"),
                _ => t.clone(),
            })
            .collect(),
    };
    let encoding = tokenizer
        .encode(text, template.is_none())
        .map_err(|e| Error::invalid(format!("prompt {id}: cannot encode: {e}")))?;
    Ok(encoding.get_ids().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(source: &str) -> ChatTemplate {
        ChatTemplate {
            source: source.into(),
            bos_token: "<s>".into(),
            eos_token: "</s>".into(),
            origin: PathBuf::from("test"),
        }
    }

    #[test]
    fn renders_messages_and_generation_prompt() {
        let t = template(
            "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'].strip() }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
        );
        assert_eq!(
            t.render("  hi ").unwrap(),
            "<s><|user|>\nhi\n<|assistant|>\n"
        );
    }

    /// The constructs Hugging Face chat templates rely on: whitespace control, `set` inside
    /// `if` (visible after it), slicing, `loop.first` / `loop.index0`, `is string`, `trim`,
    /// attribute and item access on messages, `is defined` tests.
    #[test]
    fn renders_the_constructs_of_real_templates() {
        let t = template(
            "{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set prefix = messages[0]['content'] + '\n\n' -%}
    {%- set turns = messages[1:] -%}
{%- else -%}
    {%- set prefix = '' -%}
    {%- set turns = messages -%}
{%- endif -%}
{%- if not date_string is defined %}{% set date_string = '1 Jan 2024' %}{% endif -%}
{%- for message in turns -%}
    {%- if (message.role == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception('roles must alternate') }}
    {%- endif -%}
    {{ '<turn>' + message.role + '\n' + (prefix if loop.first else '') }}
    {%- if message['content'] is string -%}{{ message['content'] | trim }}{%- endif -%}
    {{ '<end>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<turn>model ' + date_string + '\n' }}{%- endif -%}",
        );
        assert_eq!(
            t.render(" Hello ").unwrap(),
            "<s><turn>user\nHello<end>\n<turn>model 1 Jan 2024\n"
        );
    }

    #[test]
    fn renders_a_conversation_with_alternating_roles() {
        let t = template(
            "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}",
        );
        let turns = ["q1".to_string(), "a1".to_string(), "q2".to_string()];
        assert_eq!(
            t.render_conversation(&turns).unwrap(),
            "<|user|>q1\n<|assistant|>a1\n<|user|>q2\n<|assistant|>"
        );
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = template("{{ raise_exception('no system role') }}");
        let err = t.render("x").unwrap_err().to_string();
        assert!(err.contains("no system role"), "{err}");
    }
}
