//! `specdec::gguf::tokenizer` against transformers 5.23 reading the same GGUF files
//! (`AutoTokenizer.from_pretrained(dir, gguf_file=name)`), through the fixtures of
//! `scripts/gguf_tokenizer_reference.py` in tests/fixtures/gguf/tokenizer/:
//!
//! * ids with and without special tokens, and the decode of each, for ~30 strings;
//! * the built pipeline as tokenizers serializes it (normalizer, pre-tokenizer, decoder,
//!   post-processor, BPE flags) and FNV-1a hashes of vocabulary, merges and added tokens;
//! * BOS/EOS/add-BOS.
//!
//! The synthetic files (Llama 3 `llama-bpe`, Qwen2 `qwen2`, SentencePiece as `llama` and as
//! `gemma3`) always run; SmolLM2 and Gemma 3 run when models/real/ has them. Refusals are
//! checked on copies of a synthetic file with one key changed, written by [`write_gguf`].
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use specdec::gguf::tokenizer::{self, PRE_GPT2, PRE_SPLITS};
use specdec::gguf::{GgufFile, Value};
use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/tokenizer")
}

fn fixture(name: &str) -> Json {
    let path = fixture_dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn synthetic(name: &str) -> PathBuf {
    fixture_dir().join(format!("{name}.gguf"))
}

/// FNV-1a, 64 bits, over UTF-8 (the script's `fnv1a64`).
fn fnv1a64(text: &str) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in text.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    format!("{h:016x}")
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// What the fixture's `backend` records, computed from our tokenizer's own serialization.
fn backend_of(tok: &tokenizers::Tokenizer) -> BTreeMap<&'static str, Json> {
    let j: Json = serde_json::from_str(&tok.to_string(false).unwrap()).unwrap();
    let model = j["model"].as_object().unwrap();
    let mut vocab: Vec<(&str, u64)> = model["vocab"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(t, i)| (t.as_str(), i.as_u64().unwrap()))
        .collect();
    vocab.sort_by_key(|v| v.1);
    let merges: Vec<String> = model["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Json::String(s) => s.clone(),
            Json::Array(p) => format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap()),
            other => panic!("merge {other}"),
        })
        .collect();
    let mut added: Vec<&Json> = j["added_tokens"].as_array().unwrap().iter().collect();
    added.sort_by_key(|t| t["id"].as_u64().unwrap());
    let flag = |t: &Json, k: &str| u8::from(t[k].as_bool().unwrap());
    let added_text: String = added
        .iter()
        .map(|t| {
            format!(
                "{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
                t["id"],
                t["content"].as_str().unwrap(),
                flag(t, "special"),
                flag(t, "normalized"),
                flag(t, "lstrip"),
                flag(t, "rstrip"),
                flag(t, "single_word")
            )
        })
        .collect();
    let flags: serde_json::Map<String, Json> = model
        .iter()
        .filter(|(k, _)| *k != "vocab" && *k != "merges")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let vocab_text: String = vocab.iter().map(|(t, i)| format!("{i}\t{t}\n")).collect();
    let merges_text: String = merges.iter().map(|m| format!("{m}\n")).collect();
    BTreeMap::from([
        ("normalizer", j["normalizer"].clone()),
        ("pre_tokenizer", j["pre_tokenizer"].clone()),
        ("decoder", j["decoder"].clone()),
        ("post_processor", j["post_processor"].clone()),
        ("model", Json::Object(flags)),
        ("vocab_len", vocab.len().into()),
        ("vocab_fnv1a64", fnv1a64(&vocab_text).into()),
        ("merges_len", merges.len().into()),
        ("merges_fnv1a64", fnv1a64(&merges_text).into()),
        ("added_len", added.len().into()),
        ("added_fnv1a64", fnv1a64(&added_text).into()),
        ("vocab_size_with_added", tok.get_vocab_size(true).into()),
    ])
}

/// Everything the fixture `name` records, checked on the tokenizer of `path`; every difference
/// is listed before the test fails.
fn check_against_fixture(name: &str, path: &Path) {
    let want = fixture(name);
    let file = GgufFile::open(path).unwrap();
    let tok = tokenizer::from_gguf(&file).unwrap();
    let mut diffs = Vec::new();

    let got = backend_of(&tok);
    for (key, value) in &got {
        let expected = &want["backend"][*key];
        if value != expected {
            diffs.push(format!(
                "backend.{key}: got {value}, transformers {expected}"
            ));
        }
    }

    let special = tokenizer::special_tokens(&file).unwrap();
    let s = &want["special"];
    let opt = |v: &Json| v.as_u64().map(|x| x as u32);
    if special.bos != opt(&s["bos"]) || special.eos != opt(&s["eos"]) {
        diffs.push(format!("special: got {special:?}, transformers {s}"));
    }
    if special.add_bos != s["add_bos"].as_bool().unwrap() {
        diffs.push(format!(
            "add_bos: got {}, transformers {s}",
            special.add_bos
        ));
    }

    for case in want["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        for (add, ids_key, dec_key) in [
            (true, "ids_special", "decoded_special"),
            (false, "ids_plain", "decoded_plain"),
        ] {
            let expected = ids(&case[ids_key]);
            let got = tok.encode(text, add).unwrap().get_ids().to_vec();
            if got != expected {
                diffs.push(format!(
                    "{text:?} add_special_tokens={add}: got {got:?}, transformers {expected:?}"
                ));
            }
            let decoded = tok.decode(&expected, false).unwrap();
            if decoded != case[dec_key].as_str().unwrap() {
                diffs.push(format!(
                    "decode of {text:?} ({ids_key}): got {decoded:?}, transformers {}",
                    case[dec_key]
                ));
            }
        }
    }
    assert!(
        diffs.is_empty(),
        "{name}: {} differences from transformers:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

#[test]
fn smollm2_matches_transformers() {
    let Some(path) =
        common::real::real_model("smollm2_matches_transformers", common::real::SMOLLM2)
    else {
        return;
    };
    check_against_fixture("smollm2", &path);
    // candle's own GGUF tokenizer gives [38699, 905] here (GPT-2's split is not its).
    let file = GgufFile::open(&path).unwrap();
    let tok = tokenizer::from_gguf(&file).unwrap();
    assert_eq!(
        tok.encode("Hello world", false).unwrap().get_ids(),
        [19556, 905]
    );
    let template = tokenizer::chat_template(&file).unwrap().unwrap();
    assert!(template.contains("<|im_start|>"), "{template}");
    let special = tokenizer::special_tokens(&file).unwrap();
    assert_eq!((special.add_bos, special.stop), (false, vec![2]));
}

#[test]
fn gemma3_matches_transformers() {
    let Some(path) = common::real::real_model("gemma3_matches_transformers", common::real::GEMMA3)
    else {
        return;
    };
    check_against_fixture("gemma3", &path);
}

#[test]
fn llama3_bpe_matches_transformers() {
    check_against_fixture("llama-bpe", &synthetic("llama-bpe"));
    let file = GgufFile::open(&synthetic("llama-bpe")).unwrap();
    let special = tokenizer::special_tokens(&file).unwrap();
    // BOS 561 added; EOS 562 and eot 565 stop.
    assert_eq!(special.bos, Some(561));
    assert!(special.add_bos);
    assert_eq!(special.stop, vec![562, 565]);
}

#[test]
fn qwen2_matches_transformers() {
    check_against_fixture("qwen2", &synthetic("qwen2"));
}

#[test]
fn sentencepiece_llama_matches_transformers() {
    check_against_fixture("spm-llama", &synthetic("spm-llama"));
}

#[test]
fn sentencepiece_gemma3_matches_transformers() {
    check_against_fixture("spm-gemma3", &synthetic("spm-gemma3"));
}

#[test]
fn chat_template_is_read() {
    let file = GgufFile::open(&synthetic("qwen2")).unwrap();
    assert_eq!(
        tokenizer::chat_template(&file).unwrap().as_deref(),
        Some("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    );
    let without = rewrite(&synthetic("qwen2"), |m| {
        m.remove("tokenizer.chat_template");
    });
    let file = GgufFile::open(without.path()).unwrap();
    assert_eq!(tokenizer::chat_template(&file).unwrap(), None);
}

/// The table of `pre` names is transformers' own, and each split regex splits TEXTS as
/// transformers' pre-tokenizer does (names no GGUF here uses included).
#[test]
fn pre_tokenizer_splits_match_transformers() {
    let want = fixture("pre_splits");
    let table: BTreeMap<&str, &str> = want["table"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str().unwrap()))
        .collect();
    let ours: BTreeMap<&str, &str> = PRE_SPLITS.iter().copied().collect();
    assert_eq!(ours, table);
    let texts: Vec<String> = fixture("qwen2")["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_owned())
        .collect();
    let mut diffs = Vec::new();
    let names = want["splits"].as_object().unwrap();
    assert_eq!(names.len(), 6, "five regexes and GPT-2's split");
    for (name, expected) in names {
        let copy = rewrite(&synthetic("qwen2"), |m| {
            m.insert("tokenizer.ggml.pre".into(), Value::String(name.clone()));
        });
        let tok = tokenizer::from_gguf(&GgufFile::open(copy.path()).unwrap()).unwrap();
        let pre = tok.get_pre_tokenizer().unwrap();
        for (text, expected) in texts.iter().zip(expected.as_array().unwrap()) {
            let mut s = PreTokenizedString::from(text.as_str());
            pre.pre_tokenize(&mut s).unwrap();
            let got: Vec<Json> = s
                .get_splits(OffsetReferential::Original, OffsetType::Char)
                .into_iter()
                .map(|(piece, (a, b), _)| serde_json::json!([piece, [a, b]]))
                .collect();
            if &Json::Array(got.clone()) != expected {
                diffs.push(format!(
                    "{name} {text:?}: got {got:?}, transformers {expected}"
                ));
            }
        }
    }
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
}

fn error_of(path: &Path) -> String {
    let file = GgufFile::open(path).unwrap();
    tokenizer::from_gguf(&file).unwrap_err().to_string()
}

#[test]
fn unknown_pre_is_refused() {
    let copy = rewrite(&synthetic("qwen2"), |m| {
        m.insert(
            "tokenizer.ggml.pre".into(),
            Value::String("chatglm-bpe".into()),
        );
    });
    let err = error_of(copy.path());
    for part in [
        "chatglm-bpe",
        "tokenizer.ggml.pre",
        "smollm",
        "llama-bpe",
        "qwen2",
    ] {
        assert!(err.contains(part), "{part:?} not in: {err}");
    }
    assert!(err.contains(&copy.path().display().to_string()), "{err}");
    assert!(PRE_GPT2.contains(&"smollm"));
    // A byte-level file without `pre` (older than the key) gets GPT-2's split, as in
    // transformers: the same ids as `smollm`, which differ from `qwen2`'s here.
    let encode = |pre: Option<&str>| {
        let copy = rewrite(&synthetic("qwen2"), |m| match pre {
            Some(p) => {
                m.insert("tokenizer.ggml.pre".into(), Value::String(p.into()));
            }
            None => {
                m.remove("tokenizer.ggml.pre");
            }
        });
        let tok = tokenizer::from_gguf(&GgufFile::open(copy.path()).unwrap()).unwrap();
        tok.encode("x 1234567 y", false).unwrap().get_ids().to_vec()
    };
    assert_eq!(encode(None), encode(Some("smollm")));
    assert_ne!(encode(None), encode(Some("qwen2")));
    // A byte-level split on a SentencePiece vocabulary is refused too.
    let copy = rewrite(&synthetic("spm-llama"), |m| {
        m.insert(
            "tokenizer.ggml.pre".into(),
            Value::String("llama-bpe".into()),
        );
    });
    assert!(error_of(copy.path()).contains("SentencePiece"));
}

#[test]
fn unknown_model_is_refused() {
    for model in ["bert", "t5", "gemma4", "rwkv"] {
        let copy = rewrite(&synthetic("qwen2"), |m| {
            m.insert("tokenizer.ggml.model".into(), Value::String(model.into()));
        });
        let err = error_of(copy.path());
        assert!(err.contains(&format!("`{model}`")), "{err}");
        assert!(
            err.contains("tokenizer.ggml.model") && err.contains("gpt2"),
            "{err}"
        );
        let file = GgufFile::open(copy.path()).unwrap();
        assert!(tokenizer::special_tokens(&file).is_err());
    }
    let copy = rewrite(&synthetic("spm-llama"), |m| {
        m.insert("general.architecture".into(), Value::String("phi3".into()));
    });
    assert!(error_of(copy.path()).contains("phi3"));
}

#[test]
fn file_without_tokenizer_metadata_is_refused() {
    let copy = rewrite(&synthetic("qwen2"), |m| {
        m.retain(|k, _| !k.starts_with("tokenizer."));
    });
    let err = error_of(copy.path());
    assert!(
        err.contains("tokenizer.ggml.model") && err.contains("no tokenizer metadata"),
        "{err}"
    );
    assert!(err.contains(&copy.path().display().to_string()), "{err}");
}

#[test]
fn malformed_metadata_is_refused() {
    type Edit = Box<dyn Fn(&mut BTreeMap<String, Value>)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "tokenizer.ggml.bos_token_id",
            Box::new(|m| {
                m.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(1 << 20));
            }),
        ),
        (
            "tokenizer.ggml.merges",
            Box::new(|m| {
                m.insert(
                    "tokenizer.ggml.merges".into(),
                    Value::Array(vec![Value::String("a b c".into())]),
                );
            }),
        ),
        (
            "tokenizer.ggml.token_type",
            Box::new(|m| {
                m.insert(
                    "tokenizer.ggml.token_type".into(),
                    Value::Array(vec![Value::I32(1)]),
                );
            }),
        ),
        (
            "tokenizer.ggml.tokens",
            Box::new(|m| {
                m.remove("tokenizer.ggml.tokens");
            }),
        ),
    ];
    for (key, edit) in cases {
        let copy = rewrite(&synthetic("qwen2"), edit);
        let err = error_of(copy.path());
        assert!(err.contains(key), "{key} not in: {err}");
    }
    // SentencePiece without merges needs its scores.
    let copy = rewrite(&synthetic("spm-llama"), |m| {
        m.remove("tokenizer.ggml.scores");
    });
    assert!(error_of(copy.path()).contains("tokenizer.ggml.scores"));
}

/// A copy of GGUF `src` (metadata only; the synthetic files have no tensors) with `edit`
/// applied to its metadata.
fn rewrite(src: &Path, edit: impl FnOnce(&mut BTreeMap<String, Value>)) -> tempfile::NamedTempFile {
    let file = GgufFile::open(src).unwrap();
    assert_eq!(file.tensors().count(), 0, "{} has tensors", src.display());
    let mut meta: BTreeMap<String, Value> = file
        .keys()
        .map(|k| (k.to_owned(), file.get(k).unwrap().clone()))
        .collect();
    edit(&mut meta);
    let out = tempfile::Builder::new().suffix(".gguf").tempfile().unwrap();
    std::fs::write(out.path(), write_gguf(&meta)).unwrap();
    out
}

/// A GGUF v3 file of `meta` and no tensors.
fn write_gguf(meta: &BTreeMap<String, Value>) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    fn type_id(v: &Value) -> u32 {
        match v {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }
    fn value(out: &mut Vec<u8>, v: &Value) {
        match v {
            Value::U8(x) => out.extend(x.to_le_bytes()),
            Value::I8(x) => out.extend(x.to_le_bytes()),
            Value::U16(x) => out.extend(x.to_le_bytes()),
            Value::I16(x) => out.extend(x.to_le_bytes()),
            Value::U32(x) => out.extend(x.to_le_bytes()),
            Value::I32(x) => out.extend(x.to_le_bytes()),
            Value::F32(x) => out.extend(x.to_le_bytes()),
            Value::Bool(x) => out.push(u8::from(*x)),
            Value::String(s) => string(out, s),
            Value::Array(items) => {
                out.extend(items.first().map_or(4, type_id).to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for item in items {
                    value(out, item);
                }
            }
            Value::U64(x) => out.extend(x.to_le_bytes()),
            Value::I64(x) => out.extend(x.to_le_bytes()),
            Value::F64(x) => out.extend(x.to_le_bytes()),
        }
    }
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend((meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        string(&mut out, k);
        out.extend(type_id(v).to_le_bytes());
        value(&mut out, v);
    }
    out
}
