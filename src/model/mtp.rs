//! The multi-token-prediction (MTP, "nextn") head of DeepSeek-V3 and GLM:
//! a full decoder block at layer index `num_hidden_layers` that predicts one
//! token further ahead, used as a draft source for speculative decoding.
//!
//! Row j pairs the main model's final-normed hidden state h_j with the
//! token at position j+1: x_j = eh_proj([enorm(embed(tok_{j+1})) ;
//! hnorm(h_j)]), then the block (its own causal attention over MTP rows,
//! RoPE position j+1), then logits_j = head(shared_head.norm(out_j)),
//! predicting the token at position j+2. Recursive drafting feeds the
//! block's pre-norm output back as the next row's h (as transformers' MTP
//! layer and vLLM do).

use super::{Layer, Model, Rows};
use crate::error::{Error, Result};
use crate::formats::tensor::Mat;
use crate::kernels::argmax;
use crate::model::kv::KvCache;
use crate::model::profile::Profile;

/// The MTP head's resident weights.
pub struct Mtp {
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    /// (hidden, 2 * hidden)
    pub eh_proj: Mat,
    pub block: Layer,
    /// shared_head.norm
    pub norm: Vec<f32>,
    /// shared_head.head (vocab, hidden); `None`: the main lm_head.
    pub head: Option<Mat>,
    /// The block's layer index in the expert store.
    pub store_layer: usize,
}

/// The MTP block's own KV cache (one row per MTP row).
pub struct MtpState {
    kv: KvCache,
}

impl MtpState {
    /// MTP rows held.
    pub fn len(&self) -> usize {
        self.kv.len()
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.kv.is_empty()
    }

    /// Forgets the rows from `len` on (recursive drafts of a past step).
    pub fn truncate(&mut self, len: usize) {
        self.kv.truncate(len);
    }

    /// Makes room for `more` rows.
    pub fn reserve_more(&mut self, more: usize) {
        let need = self.kv.len() + more;
        if need > self.kv.capacity() {
            self.kv.grow(need.max(2 * self.kv.capacity()));
        }
    }
}

impl Model {
    fn mtp_head(&self) -> Result<&Mtp> {
        self.mtp.as_ref().ok_or_else(|| {
            Error::Request(format!(
                "{}: this checkpoint has no MTP layer (num_nextn_predict_layers = {})",
                self.cfg.path.display(),
                self.cfg.mtp_layers
            ))
        })
    }

    /// Fresh MTP state able to hold `capacity` rows.
    pub fn new_mtp_state(&self, capacity: usize) -> Result<MtpState> {
        let mtp = self.mtp_head()?;
        Ok(MtpState {
            kv: KvCache::new(&[self.kv_layout(&mtp.block)], capacity),
        })
    }

    /// Runs `m` MTP rows: `hidden` `(m, hidden)` paired with `tokens` (the
    /// token one position later). Returns the block's pre-norm outputs
    /// `(m, hidden)` and the logits `(m, vocab)`.
    pub fn mtp_forward(
        &self,
        st: &mut MtpState,
        hidden: &[f32],
        tokens: &[u32],
        prof: &mut Profile,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let mtp = self.mtp_head()?;
        self.check_tokens(tokens)?;
        let (h, m) = (self.cfg.hidden_size, tokens.len());
        assert_eq!(hidden.len(), m * h, "one hidden row per MTP token");
        st.kv.reserve(m)?;
        let emb = self.embed_rows(tokens); // (m, hidden)
        let mut cat = vec![0f32; m * 2 * h]; // (m, 2 * hidden) = [enorm(e) ; hnorm(h)]
        for t in 0..m {
            let (e_half, h_half) = cat[t * 2 * h..(t + 1) * 2 * h].split_at_mut(h);
            self.norm_rows(&emb[t * h..(t + 1) * h], &mtp.enorm, e_half);
            self.norm_rows(&hidden[t * h..(t + 1) * h], &mtp.hnorm, h_half);
        }
        let mut x = vec![0f32; m * h]; // (m, hidden)
        mtp.eh_proj.matmul(&cat, m, &mut x);
        let rows = Rows {
            n: m,
            start: st.kv.len(),
            rope_offset: 1,
            // The MTP head sees a prefill's rows pass by pass; it attends
            // them as it did chunk by chunk.
            attend_rows: super::PREFILL_CHUNK,
        };
        let mut selections = super::dsa::Selections::default();
        let mut segs = [super::Seg {
            rows,
            kv: &mut st.kv.layers[0],
            selections: &mut selections,
        }];
        // A pass's rows a sub-chunk at a time, as the decoder takes them.
        let sub = self.prefill_pass.sub_rows;
        self.layer_forward(mtp.store_layer, &mtp.block, &mut x, &mut segs, sub, prof)?;
        selections.recycle();
        st.kv.advance(m);
        let mut normed = vec![0f32; m * h];
        self.norm_rows(&x, &mtp.norm, &mut normed);
        let logits = match &mtp.head {
            Some(head) => {
                let v = self.cfg.vocab_size;
                let mut out = vec![0f32; m * v];
                head.matmul(&normed, m, &mut out);
                out
            }
            None => self.logits(&normed),
        };
        Ok((x, logits))
    }

    /// Teacher-forced MTP over `ids`: for rows j = 0..n-2 the argmax
    /// predicting `ids[j+2]`, and the last row's logits.
    pub fn mtp_one_step(&self, ids: &[u32]) -> Result<(Vec<u32>, Vec<f32>)> {
        if ids.len() < 2 {
            return Err(Error::Request("MTP needs at least 2 token ids".into()));
        }
        let mut prof = Profile::default();
        let mut kv = self.new_kv(ids.len());
        let hidden = self.forward_hidden(ids, &mut kv, &mut prof)?; // (n, hidden)
        let h = self.cfg.hidden_size;
        let m = ids.len() - 1;
        let mut st = self.new_mtp_state(m)?;
        let (_, logits) = self.mtp_forward(&mut st, &hidden[..m * h], &ids[1..], &mut prof)?;
        let v = self.cfg.vocab_size;
        let argmax_rows = logits.chunks_exact(v).map(argmax).collect();
        Ok((argmax_rows, logits[(m - 1) * v..].to_vec()))
    }

    /// Drafts `n` tokens to follow `context` + `next` (the token the main
    /// model chose after `context`): the first from the MTP rows over the
    /// context, the rest recursively from the block's own output.
    pub fn draft(&self, context: &[u32], next: u32, n: usize) -> Result<Vec<u32>> {
        if context.is_empty() {
            return Err(Error::Request(
                "MTP drafting needs a non-empty context".into(),
            ));
        }
        let mut prof = Profile::default();
        let mut kv = self.new_kv(context.len());
        let hidden = self.forward_hidden(context, &mut kv, &mut prof)?; // (P, hidden)
        let mut tokens: Vec<u32> = context[1..].to_vec();
        tokens.push(next);
        let mut st = self.new_mtp_state(context.len() + n)?;
        let (out, logits) = self.mtp_forward(&mut st, &hidden, &tokens, &mut prof)?;
        let (h, v) = (self.cfg.hidden_size, self.cfg.vocab_size);
        let mut last_out = out[out.len() - h..].to_vec();
        let mut drafts = vec![argmax(&logits[logits.len() - v..])];
        while drafts.len() < n {
            let tok = *drafts.last().expect("non-empty");
            let (out, logits) = self.mtp_forward(&mut st, &last_out, &[tok], &mut prof)?;
            drafts.push(argmax(&logits));
            last_out = out;
        }
        drafts.truncate(n);
        Ok(drafts)
    }
}
