//! The RAM budget (`--ram-gb`, SPEC §7): how many expert slots each MoE
//! layer gets so that resident weights + expert caches + itemized slack
//! stay within the budget. Pure arithmetic over byte counts, so the plan is
//! printed (and tested) before anything large is allocated.
//!
//! Slack items: the in-flight working set (a layer's worth of experts being
//! read into slabs and decoded), the KV pool for the whole context, the
//! activations and logits of the largest forward, a page-cache reserve for
//! read modes that go through the page cache (starving it cut buffered reads
//! ~4× on the seed's box), and the runtime itself (binary, tokenizer,
//! threads, allocator slack).

use std::fmt;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// What the plan needs to know, in bytes.
#[derive(Clone, Debug)]
pub struct BudgetInput {
    pub budget: u64,
    /// Always-resident weights as kept in RAM.
    pub resident: u64,
    /// One routed expert as kept in RAM.
    pub expert_ram: u64,
    /// One routed expert's read span on disk.
    pub expert_disk: u64,
    /// Experts are decoded in place in their read slab (packed
    /// containers), so a miss never holds a slab and a copy at once.
    pub expert_zero_copy: bool,
    pub moe_layers: usize,
    pub experts_per_layer: usize,
    pub top_k: usize,
    /// KV cache for the whole context.
    pub kv: u64,
    /// Activations and logits of the largest forward.
    pub activations: u64,
    /// What a layer-major prefill pass holds per position across a whole
    /// layer (the residual stream, the MoE output being summed, the
    /// routing entries, a DSA selection; no logits: a pass keeps only its
    /// last row's).
    pub pass_bytes_per_position: u64,
    /// A pass's per-row temporaries (attention projections, a routed
    /// expert's rows, a dense MLP's or the shared expert's rows): they are
    /// held for one sub-chunk of [`BudgetInput::pass_granule`] rows at a
    /// time, never for the whole pass.
    pub pass_row_bytes: u64,
    /// Positions a pass is a multiple of (the chunk of a chunked prefill,
    /// so a pass's rows attend exactly as the chunks did), unless it holds
    /// the whole context or the activations leave less than one; also the
    /// rows of a pass's sub-chunk.
    pub pass_granule: usize,
    /// Context positions planned (a pass never needs more).
    pub context: usize,
    /// The read mode goes through the page cache (buffered, drop, mmap).
    pub page_cache: bool,
    /// Prefetch reads alive at once: their slabs wait outside the cache
    /// until a layer asks for them (decoding one then replaces a demand
    /// miss, which the in-flight item already covers).
    pub prefetch_experts: usize,
    /// What the command's own inputs hold while it runs (a text being
    /// tokenized, a prompts file, reference logits): the `inputs` item.
    pub inputs: u64,
}

/// The placement: slots per layer and what the budget was spent on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetPlan {
    pub budget: u64,
    pub resident: u64,
    /// Named slack items.
    pub reserves: Vec<(&'static str, u64)>,
    pub expert_ram: u64,
    pub slots_per_layer: usize,
    pub experts_per_layer: usize,
    pub moe_layers: usize,
    /// resident + reserves + all expert slots full.
    pub projected_peak: u64,
    /// The layer-major prefill pass (its bytes: the activations and the
    /// `prefill pass` items together).
    pub prefill_pass: PrefillPass,
}

/// A layer-major prefill pass: each layer runs over this many positions of
/// a long prompt before the next layer starts, so a layer reads each of
/// its routed experts once per pass, not once per chunk. What it holds for
/// every position is small (the residual stream, the MoE sum, the routing
/// entries); its per-row temporaries live for one sub-chunk of `sub_rows`
/// rows at a time. Its bytes are the activations item and the `prefill
/// pass` item together (a pass keeps one row's logits, so it reuses the
/// activations item).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillPass {
    pub positions: usize,
    /// Held for every position of the pass while a layer runs.
    pub bytes_per_position: u64,
    /// Rows of a sub-chunk: attention, a routed expert's rows, a dense
    /// MLP's or the shared expert's run this many rows at a time.
    pub sub_rows: usize,
    /// Temporaries per row of a sub-chunk.
    pub sub_bytes_per_row: u64,
}

impl PrefillPass {
    /// What the pass holds for its positions, all layers' runs alike.
    pub fn held_bytes(&self) -> u64 {
        (self.positions as u64).saturating_mul(self.bytes_per_position)
    }

    /// One sub-chunk's temporaries (a pass shorter than a sub-chunk has
    /// only its own rows).
    pub fn sub_chunk_bytes(&self) -> u64 {
        (self.sub_rows.min(self.positions) as u64).saturating_mul(self.sub_bytes_per_row)
    }

    /// The pass's activation bytes: what it holds and one sub-chunk's
    /// temporaries (at most the plan's activations and `prefill pass`
    /// items together).
    pub fn bytes(&self) -> u64 {
        self.held_bytes().saturating_add(self.sub_chunk_bytes())
    }
}

/// The longest pass whose held bytes and one sub-chunk of temporaries fit
/// in `activations` bytes: a multiple of `granule` positions (the
/// sub-chunk's rows), capped at the context (one pass for the whole
/// context needs no rounding); at least one position.
pub fn prefill_pass(
    activations: u64,
    (bytes_per_position, sub_bytes_per_row): (u64, u64),
    granule: usize,
    context: usize,
) -> PrefillPass {
    let granule = granule.max(1);
    let sub = (granule as u64).saturating_mul(sub_bytes_per_row);
    let fit = activations
        .saturating_sub(sub)
        .checked_div(bytes_per_position)
        .map_or(usize::MAX, |f| usize::try_from(f).unwrap_or(usize::MAX));
    let aligned = if fit >= granule {
        fit / granule * granule
    } else {
        // Under one sub-chunk: as many rows as the whole of each fits.
        let per_row = bytes_per_position.saturating_add(sub_bytes_per_row);
        activations
            .checked_div(per_row)
            .map_or(usize::MAX, |f| usize::try_from(f).unwrap_or(usize::MAX))
            .min(granule)
    };
    PrefillPass {
        positions: aligned.min(context).max(1),
        bytes_per_position,
        sub_rows: granule,
        sub_bytes_per_row,
    }
}

/// Runtime reserve: binary, tokenizer, thread stacks, and allocator slack.
fn runtime_reserve(budget: u64) -> u64 {
    48 * MIB + budget / 50
}

/// Page-cache reserve for modes that read through it: an eighth of the
/// budget, at most 2.5 GiB.
fn page_cache_reserve(budget: u64) -> u64 {
    (budget / 8).min(5 * GIB / 2)
}

/// What a layer-major prefill pass may take: an eighth of the budget (or
/// the activations item, if more: a pass reuses it, keeping one row's
/// logits). The pass only holds the positions the context needs.
fn pass_share(budget: u64) -> u64 {
    budget / 8
}

/// Plans the budget, or explains (with the numbers) why it cannot fit.
/// All arithmetic is checked: an item whose bytes overflow is refused by
/// name, never wrapped into a small number.
pub fn plan(i: &BudgetInput) -> Result<BudgetPlan, String> {
    let copies = if i.expert_zero_copy { 1 } else { 2 };
    let in_flight = i
        .expert_ram
        .checked_mul(copies)
        .and_then(|ram| ram.checked_add(i.expert_disk))
        .and_then(|per| per.checked_mul(i.top_k as u64));
    let pass = prefill_pass(
        pass_share(i.budget).max(i.activations),
        (i.pass_bytes_per_position, i.pass_row_bytes),
        i.pass_granule,
        i.context,
    );
    let mut reserves = vec![
        // A layer's misses (at most top-k read at once): read into slabs
        // and decoded (a packed expert is decoded in place, zero copy),
        // while the experts they evict are still in use by the layer.
        ("in-flight experts", in_flight),
        ("KV pool", Some(i.kv)),
        ("activations", Some(i.activations)),
        (
            "prefill pass",
            Some(pass.bytes().saturating_sub(i.activations)),
        ),
        ("runtime", Some(runtime_reserve(i.budget))),
    ];
    if i.prefetch_experts > 0 {
        let bytes = (i.prefetch_experts as u64).checked_mul(i.expert_disk);
        reserves.push(("prefetch", bytes));
    }
    if i.page_cache {
        reserves.push(("page-cache reserve", Some(page_cache_reserve(i.budget))));
    }
    if i.inputs > 0 {
        reserves.push(("inputs", Some(i.inputs)));
    }
    let reserves = reserves
        .into_iter()
        .map(|(name, bytes)| {
            bytes
                .filter(|&b| b < u64::MAX)
                .map(|b| (name, b))
                .ok_or_else(|| format!("the {name} item of the RAM plan overflows 64 bits"))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let fixed = reserves
        .iter()
        .try_fold(i.resident, |sum, r| sum.checked_add(r.1))
        .ok_or("the RAM plan's fixed items overflow 64 bits")?;
    if fixed > i.budget {
        let items: Vec<String> = reserves
            .iter()
            .map(|(name, b)| format!("{name} {}", human(*b)))
            .collect();
        return Err(format!(
            "a RAM budget of {} GB is too small: resident weights {} + slack {} ({}) = {} before any expert is cached",
            i.budget as f64 / 1e9,
            human(i.resident),
            human(fixed - i.resident),
            items.join(", "),
            human(fixed)
        ));
    }
    let per_slot_row = i.expert_ram.saturating_mul(i.moe_layers as u64);
    let slots = (i.budget - fixed)
        .checked_div(per_slot_row)
        .map_or(i.experts_per_layer, |s| {
            (s as usize).min(i.experts_per_layer)
        });
    Ok(BudgetPlan {
        budget: i.budget,
        resident: i.resident,
        reserves,
        expert_ram: i.expert_ram,
        slots_per_layer: slots,
        experts_per_layer: i.experts_per_layer,
        moe_layers: i.moe_layers,
        projected_peak: fixed + slots as u64 * per_slot_row, // <= budget
        prefill_pass: pass,
    })
}

impl BudgetPlan {
    /// The activations item.
    pub fn activations(&self) -> u64 {
        self.reserve("activations")
    }

    /// The bytes of the reserve named `name` (0 when the plan has none).
    pub fn reserve(&self, name: &str) -> u64 {
        self.reserves
            .iter()
            .find(|r| r.0 == name)
            .map_or(0, |r| r.1)
    }
}

/// Bytes as `12.3 MiB` / `4.56 GiB`.
pub fn human(b: u64) -> String {
    if b >= GIB {
        format!("{:.2} GiB", b as f64 / GIB as f64)
    } else {
        format!("{:.1} MiB", b as f64 / MIB as f64)
    }
}

impl fmt::Display for BudgetPlan {
    /// The one plan line printed at start.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ram plan: budget {}, resident {}",
            human(self.budget),
            human(self.resident)
        )?;
        for (name, b) in &self.reserves {
            write!(f, ", {name} {}", human(*b))?;
            if *name == "prefill pass" {
                let pass = &self.prefill_pass;
                write!(
                    f,
                    " ({} positions x {} B held, sub-chunks of {} rows x {} B, {} with the activations)",
                    pass.positions,
                    pass.bytes_per_position,
                    pass.sub_rows.min(pass.positions),
                    pass.sub_bytes_per_row,
                    human(pass.bytes().max(self.activations()))
                )?;
            }
        }
        write!(
            f,
            "; {} per expert, {}/{} slots per layer x {} MoE layers; projected peak {}",
            human(self.expert_ram),
            self.slots_per_layer,
            self.experts_per_layer,
            self.moe_layers,
            human(self.projected_peak)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(budget: u64) -> BudgetInput {
        BudgetInput {
            budget,
            resident: 100 * MIB,
            expert_ram: MIB,
            expert_disk: MIB,
            expert_zero_copy: false,
            moe_layers: 10,
            experts_per_layer: 64,
            top_k: 4,
            kv: 8 * MIB,
            activations: 4 * MIB,
            // 8192 positions take 4.1 MB: within the activations item.
            pass_bytes_per_position: 500,
            pass_row_bytes: 0,
            pass_granule: 256,
            context: 8192,
            page_cache: false,
            prefetch_experts: 0,
            inputs: 0,
        }
    }

    #[test]
    fn a_command_s_inputs_are_an_item_that_takes_slots() {
        let without = plan(&input(500 * MIB)).unwrap();
        let with = plan(&BudgetInput {
            inputs: 32 * MIB,
            ..input(500 * MIB)
        })
        .unwrap();
        assert!(with.reserves.contains(&("inputs", 32 * MIB)));
        assert!(!without.reserves.iter().any(|r| r.0 == "inputs"));
        assert_eq!(without.slots_per_layer - with.slots_per_layer, 3);
    }

    #[test]
    fn slots_fill_what_the_reserves_leave() {
        // budget 512 MiB: fixed = 100 + 12 (in flight) + 8 + 4 + 48 + 10.24.
        let p = plan(&input(512 * MIB)).unwrap();
        let fixed = 100 * MIB + 12 * MIB + 8 * MIB + 4 * MIB + 48 * MIB + 512 * MIB / 50;
        assert_eq!(p.slots_per_layer as u64, (512 * MIB - fixed) / (10 * MIB));
        assert!(p.projected_peak <= p.budget);
        assert!(
            p.projected_peak + 10 * MIB > p.budget,
            "no whole slot row left unused"
        );
    }

    #[test]
    fn plenty_of_ram_caps_at_every_expert_and_page_cache_is_reserved() {
        let p = plan(&input(64 * GIB)).unwrap();
        assert_eq!(p.slots_per_layer, 64);
        let mut i = input(64 * GIB);
        i.page_cache = true;
        let p = plan(&i).unwrap();
        assert!(p.reserves.contains(&("page-cache reserve", 5 * GIB / 2)));
        let mut i = input(800 * MIB);
        i.page_cache = true;
        let with = plan(&i).unwrap().slots_per_layer;
        i.page_cache = false;
        assert!(with < plan(&i).unwrap().slots_per_layer);
    }

    #[test]
    fn prefetch_reserves_its_reads_and_decoded_experts() {
        let mut i = input(512 * MIB);
        let without = plan(&i).unwrap();
        i.prefetch_experts = 8;
        let with = plan(&i).unwrap();
        assert!(with.reserves.contains(&("prefetch", 8 * MIB)));
        let fixed = 100 * MIB + 12 * MIB + 8 * MIB + 4 * MIB + 48 * MIB + 512 * MIB / 50;
        assert_eq!(
            without.slots_per_layer as u64,
            (512 * MIB - fixed) / (10 * MIB)
        );
        assert_eq!(
            with.slots_per_layer as u64,
            (512 * MIB - fixed - 8 * MIB) / (10 * MIB)
        );
        assert!(with.projected_peak <= with.budget);
    }

    #[test]
    fn items_that_overflow_are_refused_by_name() {
        let mut i = input(512 * MIB);
        i.prefetch_experts = 18_014_398_509_481_984;
        assert!(plan(&i).unwrap_err().contains("prefetch"));
        let mut i = input(512 * MIB);
        i.kv = u64::MAX;
        assert!(plan(&i).unwrap_err().contains("KV pool"));
        let mut i = input(512 * MIB);
        i.kv = u64::MAX - 1;
        assert!(plan(&i).unwrap_err().contains("overflow"));
        let mut i = input(512 * MIB);
        i.top_k = usize::MAX;
        assert!(plan(&i).unwrap_err().contains("in-flight"));
    }

    #[test]
    fn a_budget_below_the_resident_set_is_refused_with_numbers() {
        let e = plan(&input(150 * MIB)).unwrap_err();
        assert!(
            e.contains("too small") && e.contains("resident weights 100.0 MiB"),
            "{e}"
        );
        // A little over the fixed part: one slot row.
        let p = plan(&input(190 * MIB)).unwrap();
        assert_eq!(p.slots_per_layer, 1);
        assert!(p.to_string().starts_with("ram plan: budget 190.0 MiB"));
    }

    #[test]
    fn the_prefill_pass_fits_the_activations_item() {
        // (activations, (held per position, per sub-chunk row), granule,
        // context) -> positions
        let table = [
            (4 * MIB, (1000, 0), 256, 8192, 4096), // 4194 fit, rounded down to 256s
            (4 * MIB, (1000, 0), 256, 3000, 3000), // the whole context in one pass
            (4 * MIB, (1000, 0), 256, 4096, 4096), // exactly the context
            (200_000, (1000, 0), 256, 8192, 200),  // under one granule: what fits
            (999, (1000, 0), 256, 8192, 1),        // never zero
            (4 * MIB, (0, 0), 256, 8192, 8192),    // nothing per position
            (4 * MIB, (1000, 0), 1, 8192, 4194),   // granule 1
            (u64::MAX, (1, 0), 256, usize::MAX, usize::MAX / 256 * 256),
            // One sub-chunk of temporaries first: (4 MiB - 1,024,000) / 1000.
            (4 * MIB, (1000, 4000), 256, 8192, 3072),
            // A sub-chunk over the item: fewer rows, each with all of it.
            (4 * MIB, (1000, 20_000), 256, 8192, 199),
            // The Qwen3-30B-A3B shape's eighth of 3.32 GB: all of 16k.
            (415_000_000, (16_700, 40_000), 256, 16_384, 16_384),
        ];
        for (activations, per, granule, context, want) in table {
            let p = prefill_pass(activations, per, granule, context);
            assert_eq!(
                p.positions, want,
                "{activations} {per:?} {granule} {context}"
            );
            assert!(p.positions <= context.max(1));
            assert_eq!(p.sub_rows, granule);
            if p.positions > 1 {
                assert!(p.bytes() <= activations, "{p:?} over {activations}");
                assert!(p.held_bytes() + p.sub_chunk_bytes() == p.bytes());
            }
        }
        // Within the activations item: no extra reserve.
        let p = plan(&input(512 * MIB)).unwrap();
        assert_eq!(p.prefill_pass.positions, 8192);
        assert_eq!(p.reserve("prefill pass"), 0);
        assert!(p.prefill_pass.bytes() <= p.activations());
        // Beyond it: an eighth of the budget, itemized, and the slots shrink.
        let mut i = input(512 * MIB);
        i.pass_bytes_per_position = 10_000;
        let p = plan(&i).unwrap();
        assert_eq!(p.prefill_pass.positions, 6656, "64 MiB / 10 kB, in 256s");
        let extra = 6656 * 10_000 - 4 * MIB;
        assert_eq!(p.reserve("prefill pass"), extra);
        assert!(p.prefill_pass.bytes() <= p.activations() + p.reserve("prefill pass"));
        assert!(p.prefill_pass.bytes() <= 512 * MIB / 8);
        let fixed = 100 * MIB + 12 * MIB + 8 * MIB + 4 * MIB + extra + 48 * MIB + 512 * MIB / 50;
        assert_eq!(p.slots_per_layer as u64, (512 * MIB - fixed) / (10 * MIB));
        assert!(p.projected_peak <= p.budget);
        assert!(
            p.to_string().contains(
                ", prefill pass 59.5 MiB (6656 positions x 10000 B held, \
                 sub-chunks of 256 rows x 0 B, 63.5 MiB with the activations)"
            ),
            "{p}"
        );
        // Per-row temporaries take one sub-chunk out of the share first.
        i.pass_row_bytes = 20_000;
        let p = plan(&i).unwrap();
        assert_eq!(p.prefill_pass.positions, 6144, "(64 MiB - 5.12 MB) / 10 kB");
        assert_eq!(p.prefill_pass.sub_chunk_bytes(), 256 * 20_000);
        assert_eq!(
            p.reserve("prefill pass"),
            6144 * 10_000 + 256 * 20_000 - 4 * MIB
        );
        assert!(p.prefill_pass.bytes() <= 512 * MIB / 8);
        // A short context: one pass holds all of it.
        i.context = 1000;
        assert_eq!(plan(&i).unwrap().prefill_pass.positions, 1000);
    }
}
