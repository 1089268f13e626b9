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
    /// The read mode goes through the page cache (buffered, drop, mmap).
    pub page_cache: bool,
    /// Prefetch reads alive at once: their slabs wait outside the cache
    /// until a layer asks for them (decoding one then replaces a demand
    /// miss, which the in-flight item already covers).
    pub prefetch_experts: usize,
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
    let mut reserves = vec![
        // A layer's misses (at most top-k read at once): read into slabs
        // and decoded (a packed expert is decoded in place, zero copy),
        // while the experts they evict are still in use by the layer.
        ("in-flight experts", in_flight),
        ("KV pool", Some(i.kv)),
        ("activations", Some(i.activations)),
        ("runtime", Some(runtime_reserve(i.budget))),
    ];
    if i.prefetch_experts > 0 {
        let bytes = (i.prefetch_experts as u64).checked_mul(i.expert_disk);
        reserves.push(("prefetch", bytes));
    }
    if i.page_cache {
        reserves.push(("page-cache reserve", Some(page_cache_reserve(i.budget))));
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
        return Err(format!(
            "a RAM budget of {} GB is too small: resident weights {} + slack {} = {} before any expert is cached",
            i.budget as f64 / 1e9,
            human(i.resident),
            human(fixed - i.resident),
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
    })
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
            page_cache: false,
            prefetch_experts: 0,
        }
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
}
