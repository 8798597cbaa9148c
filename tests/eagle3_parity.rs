//! EAGLE-3 heads in both published layouts (the EAGLE authors' `pytorch_model.bin` with
//! `midlayer.*`, and vLLM `speculators` safetensors, converted by speculators' own converter;
//! plus a speculators head with `norm_before_residual`) against reference outputs computed
//! by the `speculators` 0.9.0 model code (`scripts/eagle3_reference.py`,
//! `tests/fixtures/eagle3/README.md`): the head's logits and outputs for given hidden states
//! and tokens, and its greedy drafts over five steps, through the head and through the
//! drafter the engine runs.
mod common;

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use common::checkpoint::repo_path;
use common::host::rel_err;
use rand::{rngs::StdRng, SeedableRng};
use specdec::models::load_eagle3;
use specdec::nn::Eagle3Head;
use specdec::speculative::{
    DraftBlock, DraftRequest, Drafter, Eagle3Drafter, SamplingParams, TreeShape,
};

const CASES: [&str; 3] = ["original", "speculators", "speculators-nbr"];
/// Layers of the random verifier the fixtures were made for.
const TARGET_LAYERS: usize = 8;
const TOL: f32 = 1e-4;

fn reference(dir: &Path) -> std::collections::HashMap<String, Tensor> {
    candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu).unwrap()
}

fn load(dir: &Path) -> (Arc<Eagle3Head>, std::collections::HashMap<String, Tensor>) {
    let r = reference(dir);
    let head = load_eagle3(dir, TARGET_LAYERS, &r["embed"]).unwrap();
    (Arc::new(head), r)
}

fn ids(t: &Tensor) -> Vec<u32> {
    t.to_dtype(DType::I64)
        .unwrap()
        .to_vec1::<i64>()
        .unwrap()
        .into_iter()
        .map(|x| x as u32)
        .collect()
}

fn close(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.dims(), want.dims(), "{what}");
    let err = rel_err(got, want, 1e-3);
    assert!(err < TOL, "{what}: relative error {err}");
}

#[test]
fn head_logits_and_outputs_match_speculators() {
    for case in CASES {
        let dir = repo_path(&format!("tests/fixtures/eagle3/{case}"));
        let (head, r) = load(&dir);
        assert_eq!(head.target_layers(), [2, 4, 5], "{case}");
        let mut cache = head.new_cache().unwrap();
        let tokens = Tensor::new(ids(&r["ids"]).as_slice(), &Device::Cpu).unwrap();
        let (out, logits) = head
            .forward(&tokens, &r["hidden"], &mut cache, false)
            .unwrap();
        close(&format!("{case} logits"), &logits, &r["logits"]);
        close(&format!("{case} out"), &out, &r["out_hidden"]);
        // The greedy drafts, step by step: each feeds the last output and the last draft.
        let n = out.dim(0).unwrap();
        let (mut out, mut logits) = (
            out.narrow(0, n - 1, 1).unwrap(),
            logits.narrow(0, n - 1, 1).unwrap(),
        );
        let want = ids(&r["draft_ids"]);
        for (s, &token) in want.iter().enumerate() {
            close(
                &format!("{case} draft logits {s}"),
                &logits,
                &r["draft_logits"].narrow(0, s, 1).unwrap(),
            );
            close(
                &format!("{case} draft out {s}"),
                &out,
                &r["draft_out_hidden"].narrow(0, s, 1).unwrap(),
            );
            let best = specdec::nn::argmax_rows(&logits).unwrap()[0];
            assert_eq!(
                head.draft_to_target()[best as usize],
                token,
                "{case} draft {s}"
            );
            let t = Tensor::new(&[token], &Device::Cpu).unwrap();
            (out, logits) = head.forward(&t, &out, &mut cache, true).unwrap();
        }
    }
}

/// A read of several pairs that needs only its last row's output (`last`): the earlier rows'
/// K/V appended, only the last row queried and carried through the layer. Its output and
/// logits are the full forward's last row (bitwise on the CPU, whose kernels never depend on
/// the rows beside), the reference's too, and the next step reads the same cache.
#[test]
fn a_read_of_the_last_row_alone_is_the_full_forwards_last_row() {
    for case in CASES {
        let dir = repo_path(&format!("tests/fixtures/eagle3/{case}"));
        let (head, r) = load(&dir);
        let tokens = Tensor::new(ids(&r["ids"]).as_slice(), &Device::Cpu).unwrap();
        let n = tokens.dim(0).unwrap();
        assert!(n > 1, "{case}: the fixture reads one pair only");
        let (mut all_cache, mut last_cache) =
            (head.new_cache().unwrap(), head.new_cache().unwrap());
        let (out, logits) = head
            .forward(&tokens, &r["hidden"], &mut all_cache, false)
            .unwrap();
        let (out1, logits1) = head
            .forward(&tokens, &r["hidden"], &mut last_cache, true)
            .unwrap();
        let (want_out, want_logits) = (
            out.narrow(0, n - 1, 1).unwrap(),
            logits.narrow(0, n - 1, 1).unwrap(),
        );
        assert_eq!(rel_err(&out1, &want_out, 1e-3), 0.0, "{case} out");
        assert_eq!(rel_err(&logits1, &want_logits, 1e-3), 0.0, "{case} logits");
        close(
            &format!("{case} out against the reference"),
            &out1,
            &r["out_hidden"].narrow(0, n - 1, 1).unwrap(),
        );
        assert_eq!(all_cache.offset(), last_cache.offset(), "{case}");
        let next = Tensor::new(&[ids(&r["draft_ids"])[0]], &Device::Cpu).unwrap();
        let (a, la) = head
            .forward(&next, &want_out, &mut all_cache, true)
            .unwrap();
        let (b, lb) = head.forward(&next, &out1, &mut last_cache, true).unwrap();
        assert_eq!(rel_err(&a, &b, 1e-3), 0.0, "{case} next out");
        assert_eq!(rel_err(&la, &lb, 1e-3), 0.0, "{case} next logits");
    }
}

#[test]
fn the_drafter_drafts_what_speculators_drafts() {
    for case in CASES {
        let dir = repo_path(&format!("tests/fixtures/eagle3/{case}"));
        let (head, r) = load(&dir);
        let mut drafter = Eagle3Drafter::new("eagle3", head).unwrap();
        // Pair j is (hidden j, token j + 1): the committed context is any token, then `ids`.
        let mut context = vec![0u32];
        context.extend(ids(&r["ids"]));
        drafter.read_target(0, r["hidden"].clone()).unwrap();
        drafter.prefill(&context[..context.len() - 1]).unwrap();
        let request = DraftRequest {
            shape: TreeShape {
                depth: 5,
                width: 1,
                budget: 5,
            },
            sampling: SamplingParams::greedy(),
            queued: false,
        };
        let mut rng = StdRng::seed_from_u64(0);
        let draft = drafter.propose(&context, &request, &mut rng).unwrap();
        let DraftBlock::Chain { tokens, .. } = draft.block() else {
            panic!("{case}: a chain was asked for");
        };
        assert_eq!(tokens, ids(&r["draft_ids"]).as_slice(), "{case}");
    }
}
