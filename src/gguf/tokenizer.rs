//! The tokenizer a GGUF file's `tokenizer.*` metadata describes, as a [`tokenizers::Tokenizer`].
//!
//! A GGUF file carries no `tokenizer.json`: llama.cpp stores the vocabulary, merges, scores,
//! token types and special token ids as metadata. The reference for what tokenizer that
//! metadata means is transformers 5.23's GGUF loader, `AutoTokenizer.from_pretrained(dir,
//! gguf_file=name)` (`transformers/integrations/gguf/gguf_tokenizer_mapping.py` and the
//! tokenizer classes it hands the vocabulary to). This module rebuilds, step for step, the
//! backend tokenizer that loader builds, so ids and decodes are identical; the fixtures of
//! `scripts/gguf_tokenizer_reference.py` check that, including the serialized pipeline and
//! hashes of vocabulary, merges and added tokens (tests/gguf_tokenizer.rs).
//!
//! Supported, as transformers builds them:
//! * `tokenizer.ggml.model = "gpt2"`: byte-level BPE (`GPT2Tokenizer`): vocabulary respelled
//!   into the byte alphabet where needed, the file's merges, GPT-2's byte-level split or the
//!   split regex `tokenizer.ggml.pre` names ([`PRE_SPLITS`]; `smollm` and `gpt-2` keep GPT-2's).
//! * `tokenizer.ggml.model = "llama"`: SentencePiece BPE with byte fallback — `LlamaTokenizer`
//!   (Metaspace, merges rebuilt from the scores) or, for architectures `gemma`, `gemma2`,
//!   `gemma3`, `GemmaTokenizer` (spaces normalized to `▁`, merges rebuilt from the order of
//!   the vocabulary, whitespace-run tokens respelled).
//!
//! Refused with an error naming the file and key: any other tokenizer model (`t5`, `gemma4`,
//! `bert`, ...), a `pre` this module does not know, SentencePiece for `phi3` (transformers
//! builds Phi-3 a third way, not mirrored here), and malformed metadata.
use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::Tokenizer;
use tokenizers::{AddedToken, DecoderWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::{GgufFile, Value};
use crate::error::{Error, Result};

const MODEL: &str = "tokenizer.ggml.model";
const PRE: &str = "tokenizer.ggml.pre";
const TOKENS: &str = "tokenizer.ggml.tokens";
const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const MERGES: &str = "tokenizer.ggml.merges";
const SCORES: &str = "tokenizer.ggml.scores";
const BOS: &str = "tokenizer.ggml.bos_token_id";
const EOS: &str = "tokenizer.ggml.eos_token_id";
const UNK: &str = "tokenizer.ggml.unknown_token_id";
const PAD: &str = "tokenizer.ggml.padding_token_id";
const EOT: &str = "tokenizer.ggml.eot_token_id";
const EOM: &str = "tokenizer.ggml.eom_token_id";
const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const CHAT_TEMPLATE: &str = "tokenizer.chat_template";
const ARCH: &str = "general.architecture";

/// llama.cpp's token types (`tokenizer.ggml.token_type`) this module acts on.
const CONTROL: u64 = 3;
const USER_DEFINED: u64 = 4;

/// The Llama 3 split (transformers' `_LLAMA3_SPLIT`).
const LLAMA3_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// Mistral's Tekken split (`_TEKKEN_SPLIT`).
const TEKKEN_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// The GPT-4o split (`_GPT4O_SPLIT`).
const GPT4O_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// The Qwen2 split (`models/qwen2/tokenization_qwen2.py`'s `PRETOKENIZE_REGEX`).
const QWEN2_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// The Qwen3.5 split (`models/qwen3_5/tokenization_qwen3_5.py`'s `PRETOKENIZE_REGEX`).
const QWEN35_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}",
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// `tokenizer.ggml.pre` values and the split regex transformers puts before the byte-level
/// step for each (`GGUF_PRE_TOKENIZER_SPLITS`, in full).
pub const PRE_SPLITS: &[(&str, &str)] = &[
    ("llama3", LLAMA3_SPLIT),
    ("llama-v3", LLAMA3_SPLIT),
    ("llama-bpe", LLAMA3_SPLIT),
    ("falcon3", LLAMA3_SPLIT),
    ("falcon-h1", LLAMA3_SPLIT),
    ("pixtral", LLAMA3_SPLIT),
    ("midm-2.0", LLAMA3_SPLIT),
    ("lfm2", LLAMA3_SPLIT),
    ("jina-v5-nano", LLAMA3_SPLIT),
    ("dbrx", LLAMA3_SPLIT),
    ("smaug-bpe", LLAMA3_SPLIT),
    ("tekken", TEKKEN_SPLIT),
    ("qwen2", QWEN2_SPLIT),
    ("deepseek-r1-qwen", QWEN2_SPLIT),
    ("kormo", QWEN2_SPLIT),
    ("f2llmv2", QWEN2_SPLIT),
    ("megrez", QWEN2_SPLIT),
    ("qwen35", QWEN35_SPLIT),
    ("gpt-4o", GPT4O_SPLIT),
    ("llama4", GPT4O_SPLIT),
    ("kanana2", GPT4O_SPLIT),
    ("talkie", GPT4O_SPLIT),
    ("minimax-m2", GPT4O_SPLIT),
];

/// `pre` values for which transformers keeps `GPT2Tokenizer`'s own byte-level split (GPT-2's
/// regex): every name outside [`PRE_SPLITS`] gets it there, but only these are accepted here,
/// where it is also what the name means: `gpt-2` is llama.cpp's name for GPT-2's split, and
/// `smollm` is SmolLM2 (checked against the real file). Other names are refused rather than
/// silently given GPT-2's split.
pub const PRE_GPT2: &[&str] = &["gpt-2", "smollm"];

/// Architectures whose SentencePiece vocabulary transformers reads as `GemmaTokenizer`.
const GEMMA_ARCHS: &[&str] = &["gemma", "gemma2", "gemma3"];

/// BOS/EOS ids and whether BOS is added, from the metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialTokens {
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// Whether encoding with special tokens puts BOS first: `tokenizer.ggml.add_bos_token`,
    /// absent meaning true for a SentencePiece (`llama`) vocabulary and false otherwise (as
    /// transformers reads it), and false whatever the flag when there is no BOS.
    pub add_bos: bool,
    /// The ids that end a generation: EOS, then `eot_token_id` and `eom_token_id` when the
    /// file has them, without repeats.
    pub stop: Vec<u32>,
}

/// The tokenizer a GGUF file's `tokenizer.*` metadata describes, built as transformers builds
/// it from the same file (see the module documentation for what is supported).
pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
    let meta = Meta::read(file)?;
    let build = fail(file);
    // 1. The model and pipeline of the tokenizer class transformers hands the vocabulary to,
    //    and the special tokens that class's constructor adds on its own (its defaults, in
    //    its order: one missing from the vocabulary gets the next free id, as there).
    let (mut tok, defaults): (Tokenizer, &[&str]) = match meta.model.as_str() {
        "gpt2" => (byte_level(file, &meta)?, &["<|endoftext|>"]),
        "llama" if GEMMA_ARCHS.contains(&meta.arch.as_deref().unwrap_or("")) => (
            gemma(file, &meta)?,
            &["<bos>", "<eos>", "<unk>", "<pad>", "<mask>"],
        ),
        "llama" => (llama(file, &meta)?, &["<s>", "</s>", "<unk>"]),
        _ => unreachable!("Meta::read refuses other models"),
    };
    add_special(&mut tok, defaults.iter().copied());
    // 2. `add_gguf_special_tokens`: control tokens as special tokens (in a byte-level
    //    vocabulary only those spelled in the byte alphabet: others are llama.cpp mislabels),
    //    then user-defined tokens as plain added tokens when the vocabulary has them.
    let alphabet = byte_alphabet();
    let control: Vec<AddedToken> = meta
        .typed(CONTROL)
        .filter(|t| meta.model != "gpt2" || t.chars().all(|c| alphabet.contains(&c)))
        .map(|t| AddedToken::from(t, true))
        .collect();
    if !control.is_empty() {
        tok.add_special_tokens(&control);
    }
    let user: Vec<AddedToken> = meta
        .typed(USER_DEFINED)
        .filter(|t| tok.token_to_id(t).is_some())
        .map(|t| AddedToken::from(t, false).normalized(false))
        .collect();
    if !user.is_empty() {
        tok.add_tokens(&user);
    }
    // 3. `set_split_regex`: the split `pre` names, before a byte-level step without regex.
    if let Some(regex) = meta.split {
        let split = Split::new(
            SplitPattern::Regex(regex.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(&build)?;
        tok.with_pre_tokenizer(Some(PreSequence::new(vec![
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
        ])));
    }
    // 4. The outer tokenizer's named special tokens (those of the metadata), added as special
    //    when not yet added tokens, then its post-processor: BOS/EOS as the flags say.
    let named = |id: Option<u32>| id.map(|i| meta.tokens[i as usize].as_str());
    let specials = specials_of(file, &meta)?;
    let (bos, eos) = (named(specials.bos), named(specials.eos));
    let unk = named(meta.token_id(file, UNK)?);
    let pad = named(meta.token_id(file, PAD)?);
    add_special(&mut tok, [bos, eos, unk, pad].into_iter().flatten());
    let add_eos = file.bool(ADD_EOS)?.unwrap_or(false) && eos.is_some();
    let bos = bos.filter(|_| specials.add_bos);
    let eos = eos.filter(|_| add_eos);
    let post = post_processor(&tok, bos, eos).map_err(&build)?;
    tok.with_post_processor(Some(post));
    Ok(tok)
}

/// `tokenizer.chat_template`, when the file has one.
pub fn chat_template(file: &GgufFile) -> Result<Option<String>> {
    Ok(file.str(CHAT_TEMPLATE)?.map(str::to_owned))
}

/// BOS/EOS ids, add-BOS and the stop ids from the metadata (see [`SpecialTokens`]).
pub fn special_tokens(file: &GgufFile) -> Result<SpecialTokens> {
    specials_of(file, &Meta::read(file)?)
}

fn specials_of(file: &GgufFile, meta: &Meta) -> Result<SpecialTokens> {
    let bos = meta.token_id(file, BOS)?;
    let eos = meta.token_id(file, EOS)?;
    let add_bos = file.bool(ADD_BOS)?.unwrap_or(meta.model == "llama") && bos.is_some();
    let mut stop = Vec::new();
    for id in [eos, meta.token_id(file, EOT)?, meta.token_id(file, EOM)?]
        .into_iter()
        .flatten()
    {
        if !stop.contains(&id) {
            stop.push(id);
        }
    }
    Ok(SpecialTokens {
        bos,
        eos,
        add_bos,
        stop,
    })
}

/// The metadata every tokenizer reads, checked.
struct Meta {
    model: String,
    arch: Option<String>,
    tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`, one per token; empty when the file has none.
    types: Vec<u64>,
    /// The split regex of `pre` ([`PRE_SPLITS`]), when it names one.
    split: Option<&'static str>,
}

impl Meta {
    fn read(file: &GgufFile) -> Result<Self> {
        let model = file
            .str(MODEL)?
            .ok_or_else(|| file.key_error(MODEL, "missing: the file has no tokenizer metadata"))?;
        if model != "gpt2" && model != "llama" {
            return Err(file.key_error(
                MODEL,
                format!(
                    "tokenizer model `{model}` is not supported; supported: `gpt2` (byte-level \
                     BPE) and `llama` (SentencePiece BPE with byte fallback)"
                ),
            ));
        }
        let arch = file.str(ARCH)?.map(str::to_owned);
        if model == "llama" && arch.as_deref() == Some("phi3") {
            return Err(file.key_error(
                ARCH,
                "a SentencePiece vocabulary of architecture `phi3` is not supported \
                 (transformers builds Phi-3's tokenizer differently; not mirrored here)",
            ));
        }
        let tokens = strings(file, TOKENS)?.ok_or_else(|| file.key_error(TOKENS, "missing"))?;
        if tokens.is_empty() || u32::try_from(tokens.len()).is_err() {
            return Err(file.key_error(TOKENS, format!("{} tokens", tokens.len())));
        }
        let types = match file.array(TOKEN_TYPE)? {
            None => Vec::new(),
            Some(values) => {
                let types = values
                    .iter()
                    .map(Value::as_u64)
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| file.key_error(TOKEN_TYPE, "expected non-negative integers"))?;
                if types.len() != tokens.len() {
                    return Err(file.key_error(
                        TOKEN_TYPE,
                        format!("{} types for {} tokens", types.len(), tokens.len()),
                    ));
                }
                types
            }
        };
        let pre = file.str(PRE)?;
        let split = pre.and_then(|p| PRE_SPLITS.iter().find(|(n, _)| *n == p).map(|s| s.1));
        match (model, pre) {
            // transformers gives any other name GPT-2's split: see PRE_GPT2 for why only
            // these are accepted; an old file without `pre` gets GPT-2's split, as there.
            ("gpt2", Some(p)) if split.is_none() && !PRE_GPT2.contains(&p) => {
                let known: Vec<&str> = PRE_GPT2
                    .iter()
                    .copied()
                    .chain(PRE_SPLITS.iter().map(|s| s.0))
                    .collect();
                return Err(file.key_error(
                    PRE,
                    format!(
                        "pre-tokenizer `{p}` is not supported; known: {}",
                        known.join(", ")
                    ),
                ));
            }
            // llama.cpp ignores `pre` for SentencePiece; transformers would put a byte-level
            // split before it, which no real file asks for: refused rather than guessed.
            ("llama", Some(p)) if split.is_some() => {
                return Err(file.key_error(
                    PRE,
                    format!("byte-level pre-tokenizer `{p}` on a SentencePiece vocabulary"),
                ));
            }
            _ => {}
        }
        Ok(Self {
            model: model.to_owned(),
            arch,
            tokens,
            types,
            split,
        })
    }

    /// The tokens whose type is `kind`, in id order.
    fn typed(&self, kind: u64) -> impl Iterator<Item = &str> {
        self.types
            .iter()
            .zip(&self.tokens)
            .filter(move |(t, _)| **t == kind)
            .map(|(_, token)| token.as_str())
    }

    /// Token id `key`, checked against the vocabulary.
    fn token_id(&self, file: &GgufFile, key: &str) -> Result<Option<u32>> {
        match file.u64(key)? {
            None => Ok(None),
            Some(id) if (id as usize) < self.tokens.len() => Ok(Some(id as u32)),
            Some(id) => Err(file.key_error(
                key,
                format!("token id {id} outside the {} tokens", self.tokens.len()),
            )),
        }
    }
}

/// String array `key`, `None` when absent.
fn strings(file: &GgufFile, key: &str) -> Result<Option<Vec<String>>> {
    let Some(values) = file.array(key)? else {
        return Ok(None);
    };
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str()
                .map(str::to_owned)
                .ok_or_else(|| file.key_error(key, format!("element {i} is a {}", v.type_name())))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// `{token: index}` as Python builds it from the list: a repeated token keeps its last index.
fn vocab_of(tokens: &[String]) -> Vocab {
    let mut vocab = Vocab::default();
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t.clone(), i as u32);
    }
    vocab
}

/// The merges the file lists (`tokenizer.ggml.merges`, each `"left right"`), if any.
fn file_merges(file: &GgufFile) -> Result<Option<Vec<(String, String)>>> {
    let Some(merges) = strings(file, MERGES)? else {
        return Ok(None);
    };
    merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            // transformers splits on every space and needs exactly two parts.
            let mut parts = m.split(' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(a), Some(b), None) => Ok((a.to_owned(), b.to_owned())),
                _ => Err(file.key_error(MERGES, format!("merge {i} `{m}` is not `left right`"))),
            }
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// GPT-2's byte-to-character table (`bytes_to_unicode`): printable bytes stand for
/// themselves, the others for 256, 257, ... in byte order.
fn bytes_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b, 33..=126 | 161..=172 | 174..=255);
        let code = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        *slot = char::from_u32(code).expect("below 0x200");
    }
    table
}

fn byte_alphabet() -> HashSet<char> {
    bytes_to_unicode().into_iter().collect()
}

/// A `tokenizers` error while building, as this crate's error naming the file.
fn fail(file: &GgufFile) -> impl Fn(tokenizers::Error) -> Error + '_ {
    move |e| {
        Error::invalid(format!(
            "{}: building the tokenizer of its `tokenizer.*` metadata: {e}",
            file.path().display()
        ))
    }
}

/// `byte_level_tokenizer` + `GPT2Tokenizer`: a token already spelled in the byte alphabet is
/// kept, any other is respelled byte by byte from its UTF-8 (as `<|fim pad|>` or a raw-space
/// token would be); BPE over the file's merges; GPT-2's byte-level split and decoder.
fn byte_level(file: &GgufFile, meta: &Meta) -> Result<Tokenizer> {
    let table = bytes_to_unicode();
    let alphabet = byte_alphabet();
    let spelled: Vec<String> = meta
        .tokens
        .iter()
        .map(|t| {
            if t.chars().all(|c| alphabet.contains(&c)) {
                t.clone()
            } else {
                t.bytes().map(|b| table[b as usize]).collect()
            }
        })
        .collect();
    let merges = file_merges(file)?.ok_or_else(|| file.key_error(MERGES, "missing"))?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_of(&spelled), merges)
        .continuing_subword_prefix(String::new())
        .end_of_word_suffix(String::new())
        .fuse_unk(false)
        .build()
        .map_err(fail(file))?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevel::default()));
    Ok(tok)
}

/// `sentencepiece_tokenizer` + `LlamaTokenizer`: BPE with byte fallback and fused unknowns,
/// merges from the file or rebuilt from the scores, Metaspace prepending `▁` to the first
/// section only, and a decoder that strips the one space it leads with.
/// `tokenizer.ggml.add_space_prefix` is not read: transformers builds `LlamaTokenizer` with
/// its default (prefix on) whatever the file says, and the reference is followed.
fn llama(file: &GgufFile, meta: &Meta) -> Result<Tokenizer> {
    let vocab = vocab_of(&meta.tokens);
    let merges = match file_merges(file)? {
        Some(m) => m,
        None => {
            let scores = scores(file, meta)?;
            derive_merges(&meta.tokens, &vocab, |i| scores[i])
        }
    };
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .fuse_unk(true)
        .byte_fallback(true)
        .build()
        .map_err(fail(file))?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::First, false)));
    tok.with_decoder(Some(DecoderSequence::new(vec![
        DecoderWrapper::Replace(Replace::new("▁", " ").map_err(fail(file))?),
        DecoderWrapper::ByteFallback(ByteFallback::default()),
        DecoderWrapper::Fuse(Fuse::default()),
        DecoderWrapper::Strip(Strip::new(' ', 1, 0)),
    ])));
    Ok(tok)
}

/// `gemma_tokenizer` + `GemmaTokenizer`: a token made only of whitespace that contains a space
/// is respelled as that many `▁` (Gemma stores runs of spaces as real spaces); merges from the
/// file or rebuilt with each token ranked by its position in the file (Gemma's scores do not
/// follow its merge order); BPE with byte fallback and `<unk>`; spaces normalized to `▁`.
fn gemma(file: &GgufFile, meta: &Meta) -> Result<Tokenizer> {
    let respelled: Vec<String> = meta
        .tokens
        .iter()
        .map(|t| {
            if t.contains(' ') && t.chars().all(python_isspace) {
                "▁".repeat(t.chars().count())
            } else {
                t.clone()
            }
        })
        .collect();
    let vocab = vocab_of(&respelled);
    let merges = match file_merges(file)? {
        Some(m) => m,
        None => derive_merges(&respelled, &vocab, |i| -(i as f64)),
    };
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .unk_token("<unk>".into())
        .fuse_unk(true)
        .byte_fallback(true)
        .build()
        .map_err(fail(file))?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_normalizer(Some(Replace::new(" ", "▁").map_err(fail(file))?));
    tok.with_pre_tokenizer(Some(
        Split::new(
            SplitPattern::String(" ".into()),
            SplitDelimiterBehavior::MergedWithPrevious,
            false,
        )
        .map_err(fail(file))?,
    ));
    tok.with_decoder(Some(DecoderSequence::new(vec![
        DecoderWrapper::Replace(Replace::new("▁", " ").map_err(fail(file))?),
        DecoderWrapper::ByteFallback(ByteFallback::default()),
        DecoderWrapper::Fuse(Fuse::default()),
    ])));
    Ok(tok)
}

/// Python's `str.isspace` for one character: Unicode White_Space plus U+001C..U+001F.
fn python_isspace(c: char) -> bool {
    c.is_whitespace() || matches!(c, '\u{1c}'..='\u{1f}')
}

/// `tokenizer.ggml.scores`, one float per token.
fn scores(file: &GgufFile, meta: &Meta) -> Result<Vec<f64>> {
    let values = file
        .array(SCORES)?
        .ok_or_else(|| file.key_error(SCORES, "missing, and the file lists no merges"))?;
    let scores = values
        .iter()
        .map(Value::as_f64)
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| file.key_error(SCORES, "expected numbers"))?;
    if scores.len() != meta.tokens.len() {
        return Err(file.key_error(
            SCORES,
            format!("{} scores for {} tokens", scores.len(), meta.tokens.len()),
        ));
    }
    Ok(scores)
}

/// transformers' `generate_merges(vocab, vocab_scores)`: every split of a token into two
/// tokens of the vocabulary, best first. `score(i)` is the score of the token at index `i`;
/// Python's dict keeps a repeated token at its first place with its last score, as here.
/// Within one token the splits are ordered by the pieces' ids; then all are stably sorted by
/// (score, left length, right length), descending, lengths in characters.
fn derive_merges(
    tokens: &[String],
    vocab: &Vocab,
    score: impl Fn(usize) -> f64,
) -> Vec<(String, String)> {
    let mut last: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        last.insert(t, i);
    }
    struct Merge<'a> {
        score: f64,
        left: &'a str,
        right: &'a str,
        len_left: usize,
        len_right: usize,
    }
    let mut merges = Vec::new();
    let mut seen = HashSet::with_capacity(tokens.len());
    for t in tokens {
        if !seen.insert(t.as_str()) {
            continue;
        }
        let score = score(last[t.as_str()]);
        let mut local: Vec<(u32, u32, &str, &str)> = t
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (l, r) = t.split_at(at);
                Some((*vocab.get(l)?, *vocab.get(r)?, l, r))
            })
            .collect();
        local.sort_by_key(|m| (m.0, m.1));
        merges.extend(local.into_iter().map(|(_, _, left, right)| Merge {
            score,
            left,
            right,
            len_left: left.chars().count(),
            len_right: right.chars().count(),
        }));
    }
    merges.sort_by(|a, b| {
        b.score
            .partial_cmp(&a.score)
            .unwrap_or(Ordering::Equal)
            .then(b.len_left.cmp(&a.len_left))
            .then(b.len_right.cmp(&a.len_right))
    });
    merges
        .into_iter()
        .map(|m| (m.left.to_owned(), m.right.to_owned()))
        .collect()
}

/// Adds `tokens` as special added tokens (not normalized), skipping repeats and those already
/// added — transformers' constructors do this for their named special tokens.
fn add_special<'a>(tok: &mut Tokenizer, tokens: impl IntoIterator<Item = &'a str>) {
    let added: HashSet<String> = tok
        .get_added_tokens_decoder()
        .into_values()
        .map(|t| t.content)
        .collect();
    let mut new: Vec<AddedToken> = Vec::new();
    for t in tokens {
        if !added.contains(t) && !new.iter().any(|n| n.content == t) {
            new.push(AddedToken::from(t, true));
        }
    }
    if !new.is_empty() {
        tok.add_tokens(&new);
    }
}

/// `TokenizersBackend.update_post_processor`: `[bos] $A [eos]`, and for pairs
/// `[bos] $A [eos] [bos] $B [eos]` with type id 1 on the second half; `None` leaves a token out.
/// The templates are the strings transformers writes, parsed the same way.
fn post_processor(
    tok: &Tokenizer,
    bos: Option<&str>,
    eos: Option<&str>,
) -> tokenizers::Result<TemplateProcessing> {
    let piece = |t: Option<&str>, type_id: u32| t.map(|t| format!("{t}:{type_id}"));
    let single: Vec<String> = [piece(bos, 0), Some("$A:0".into()), piece(eos, 0)]
        .into_iter()
        .flatten()
        .collect();
    let mut pair = single.clone();
    pair.extend(
        [piece(bos, 1), Some("$B:1".into()), piece(eos, 1)]
            .into_iter()
            .flatten(),
    );
    let mut specials = Vec::new();
    for t in [bos, eos].into_iter().flatten() {
        let id = tok
            .token_to_id(t)
            .ok_or_else(|| format!("special token `{t}` has no id"))?;
        specials.push((t.to_owned(), id));
    }
    Ok(TemplateProcessing::builder()
        .try_single(single.join(" "))?
        .try_pair(pair.join(" "))?
        .special_tokens(specials)
        .build()?)
}
