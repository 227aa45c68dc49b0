//! The simulator's promises: a seed replays bit for bit, and under random delays, losses,
//! crashes and restarts every node finishes, every node that completes a round holds the same
//! state, and the swarm makes progress — in private swarms, and in open ones with a bootstrap,
//! with nodes that wait for each round's average and with nodes that train ahead (overlap).

use super::*;
use clap::Parser;
use proptest::prelude::*;

#[derive(Parser)]
struct Wrap {
    #[command(flatten)]
    args: SimArgs,
}

/// The defaults of `nightshift-lab sim`, with `flags` on top.
fn args(flags: &[&str]) -> SimArgs {
    Wrap::parse_from(std::iter::once("sim").chain(flags.iter().copied())).args
}

fn outcome(r: &SimResult) -> String {
    serde_json::to_string(&(&r.rounds, &r.summary)).unwrap()
}

#[test]
fn the_same_seed_writes_the_same_file() {
    let flags = [
        "--nodes",
        "6",
        "--rounds",
        "4",
        "--loss",
        "0.03",
        "--crash-every-secs",
        "15",
        "--down-secs",
        "4",
        "--private",
    ];
    let a = simulate(&args(&[&flags[..], &["--seed", "7"]].concat())).unwrap();
    let b = simulate(&args(&[&flags[..], &["--seed", "7"]].concat())).unwrap();
    let c = simulate(&args(&[&flags[..], &["--seed", "8"]].concat())).unwrap();
    assert_eq!(outcome(&a), outcome(&b));
    assert_ne!(outcome(&a), outcome(&c), "another seed, another run");
    assert!(a.summary.crashes > 0, "the schedule crashed nodes");
}

#[test]
fn the_real_model_trains_through_the_simulator_and_the_nodes_agree() {
    let flags = [
        "--model", "tiny", "--nodes", "3", "--rounds", "3", "--seed", "5",
    ];
    let r = simulate(&args(&flags)).unwrap();
    assert!(r.summary.failures.is_empty(), "{:?}", r.summary.failures);
    assert_eq!(r.summary.nodes_finished, 3);
    for row in &r.rounds {
        assert_eq!(row.distinct_state_hashes, 1, "{row:?}");
    }
    let first = r.rounds[0].val_loss.unwrap();
    let last = r.rounds.last().unwrap().val_loss.unwrap();
    assert!(last < first, "{first} → {last}");
    // Bit for bit again: burn's CPU training is deterministic for a seed.
    assert_eq!(outcome(&r), outcome(&simulate(&args(&flags)).unwrap()));
}

#[test]
fn a_declared_wire_width_weighs_the_values_and_nothing_else() {
    let run = |wire: Option<&str>| {
        let mut flags = vec![
            "--nodes",
            "4",
            "--rounds",
            "3",
            "--params",
            "8192",
            "--reduce",
            "0:int8:64",
        ];
        if let Some(w) = wire {
            flags.extend(["--wire-params", w]);
        }
        let r = simulate(&args(&flags)).unwrap();
        let last = r.rounds.last().unwrap().clone();
        (
            last.bytes_up_median,
            last.status_bytes_up_median,
            last.val_loss,
        )
    };
    let (up, statuses, loss) = run(None);
    let (up10, statuses10, loss10) = run(Some("81920"));
    // Ten times the values: the bulk grows about tenfold, the statuses and the learning do not.
    assert!(up10 > 5 * up, "{up} → {up10}");
    assert!(
        statuses10 < 2 * statuses && statuses < 2 * statuses10,
        "{statuses} → {statuses10}"
    );
    assert_eq!(loss, loss10);
}

#[test]
fn a_fully_connected_swarm_agrees_on_every_round_and_learns() {
    let r = simulate(&args(&["--nodes", "12", "--rounds", "5", "--degree", "11"])).unwrap();
    assert_eq!(r.summary.nodes_finished, 12);
    for row in &r.rounds {
        assert_eq!(
            (row.nodes_completed, row.distinct_state_hashes),
            (12, 1),
            "{row:?}"
        );
        assert!(row.bytes_up_max > 0 && row.round_secs > 0.0);
    }
    let first = r.rounds[0].val_loss.unwrap();
    let last = r.rounds.last().unwrap().val_loss.unwrap();
    assert!(last < first.max(0.05), "{first} → {last}");
}

#[test]
fn lost_contributions_leave_the_swarm_agreeing_and_learning() {
    let r = simulate(&args(&[
        "--nodes",
        "5",
        "--rounds",
        "10",
        "--drop",
        "0.3",
        "--private",
        "--seed",
        "3",
    ]))
    .unwrap();
    assert!(r.summary.failures.is_empty(), "{:?}", r.summary.failures);
    assert!(r.summary.contributions_dropped >= 5, "{:?}", r.summary);
    // A node whose contribution was lost comes back, takes the round's state and goes on: every
    // node holds every round's state, and they agree.
    for row in &r.rounds {
        assert_eq!(
            (row.nodes_completed, row.distinct_state_hashes),
            (5, 1),
            "{row:?}"
        );
    }
    let first = r.rounds[0].val_loss.unwrap();
    let last = r.rounds.last().unwrap().val_loss.unwrap();
    assert!(last < first, "{first} → {last}");
}

#[test]
fn a_swarm_split_into_two_chains_meets_again_on_the_attested_one() {
    // Two swarms the fault batches found split for good before chains were compared
    // (`scripts/sim_faults.py`): a private swarm of 4 where one node formed a round over a set
    // of its own and trained on alone (seed 7227, case 565), and an open one of 3 whose
    // bootstrap followed a lesser state of round 2 (seed 9229 with `--open-loss`, case 150).
    let private = "--nodes 4 --latency-ms 18 --jitter-ms 128 --loss 0.040368694488388604 \
                   --crash-every-secs 18.888839460301597 --down-secs 11.286420154350278 \
                   --seed 7177 --private";
    let open = "--nodes 3 --latency-ms 69 --jitter-ms 18 --loss 0.025258315723797848 \
                --crash-every-secs 17.753291166692076 --down-secs 10.33589776761305 \
                --seed 287993 --bootstraps 1";
    for case in [private, open] {
        let line = format!("{case} --rounds 8 --crashes-until-secs 20 --reduce 0:int8:64");
        let flags: Vec<&str> = line.split_whitespace().collect();
        let r = simulate(&args(&flags)).unwrap();
        assert!(r.summary.failures.is_empty(), "{:?}", r.summary.failures);
        let nodes: usize = flags[1].parse().unwrap();
        assert_eq!(r.summary.nodes_finished, nodes, "{case:?}");
        for row in &r.rounds {
            assert_eq!(row.distinct_state_hashes, 1, "{case:?}: {row:?}");
        }
    }
}

#[test]
fn averaging_slice_by_slice_keeps_a_nodes_bytes_flat_and_learns_as_all_to_all_does() {
    // A model of 200,000 values (int4 contributions of ~100 KB): each node's upload per round,
    // statuses aside, stays flat from 4 to 16 nodes, where sending to every peer grows with
    // the swarm; the swarm agrees on every round and ends where all-to-all averaging ends.
    let run = |nodes: usize, reduce: bool| {
        let (n, d) = (nodes.to_string(), (nodes - 1).to_string());
        let mut flags = vec![
            "--nodes", &n, "--degree", &d, "--rounds", "4", "--params", "200000", "--seed", "3",
        ];
        if reduce {
            flags.extend(["--reduce", "0:int8:64"]);
        }
        let r = simulate(&args(&flags)).unwrap();
        assert!(r.summary.failures.is_empty(), "{:?}", r.summary.failures);
        for row in &r.rounds {
            assert_eq!(
                (row.nodes_completed, row.distinct_state_hashes),
                (nodes, 1),
                "{row:?}"
            );
        }
        let last = r.rounds.last().unwrap().clone();
        let bulk = last.bytes_up_median - last.status_bytes_up_median;
        (bulk, last.val_loss.unwrap())
    };
    let (small, _) = run(4, true);
    let (large, loss) = run(16, true);
    let (whole, whole_loss) = run(16, false);
    assert!(
        large as f64 <= 1.3 * small as f64,
        "{large} bytes up at 16 nodes, {small} at 4"
    );
    assert!(
        whole > 2 * large,
        "all-to-all {whole} bytes up, reducers {large}"
    );
    assert!(
        (loss - whole_loss).abs() <= 0.01 * whole_loss,
        "{loss} against all-to-all's {whole_loss}"
    );
}

proptest! {
    // A fixed seed: the same 64 swarms on every run, so that CI is reproducible. Random draws
    // are how the rules' faults were found (DESIGN-NOTES lists them): change the seed, or raise
    // the cases, to explore others.
    #![proptest_config(ProptestConfig {
        cases: 64,
        rng_seed: proptest::test_runner::RngSeed::Fixed(25),
        ..ProptestConfig::default()
    })]

    #[test]
    fn under_delays_losses_and_crashes_every_node_agrees_and_finishes(
        nodes in 2usize..=7,
        latency in 1u64..150,
        jitter in 0u64..150,
        loss in 0.0f64..0.05,
        crash in prop_oneof![Just(0.0), 15.0f64..60.0],
        down in 1.0f64..12.0,
        seed in 0u64..1_000_000,
        private in any::<bool>(),
        overlap in any::<bool>(),
    ) {
        faults_hold(nodes, latency, jitter, loss, crash, down, seed, private, overlap, None)?;
    }

    /// The same swarms, averaging slice by slice through reducers (one slice per contributor,
    /// int8 means).
    #[test]
    fn averaging_slice_by_slice_under_delays_losses_and_crashes_every_node_agrees_and_finishes(
        nodes in 2usize..=7,
        latency in 1u64..150,
        jitter in 0u64..150,
        loss in 0.0f64..0.05,
        crash in prop_oneof![Just(0.0), 15.0f64..60.0],
        down in 1.0f64..12.0,
        seed in 0u64..1_000_000,
        private in any::<bool>(),
        overlap in any::<bool>(),
    ) {
        let reduce = Some("0:int8:64");
        faults_hold(nodes, latency, jitter, loss, crash, down, seed, private, overlap, reduce)?;
    }
}

/// One swarm of the fault tests: every node finishes, agrees on every round, and learns.
#[allow(clippy::too_many_arguments)]
fn faults_hold(
    nodes: usize,
    latency: u64,
    jitter: u64,
    loss: f64,
    crash: f64,
    down: f64,
    seed: u64,
    private: bool,
    overlap: bool,
    reduce: Option<&str>,
) -> Result<(), TestCaseError> {
    {
        let nodes_s = nodes.to_string();
        // Open swarms lose messages too: a bootstrap that loses the fetch of the preferred
        // state's contribution follows a lesser one, and the trainers on the preferred one then
        // leave it for the chain the bootstrap attests (`rules::Candidate::Cross`).
        let (lat, jit, loss_s) = (latency.to_string(), jitter.to_string(), format!("{loss}"));
        let (crash_s, down_s, seed_s) = (format!("{crash}"), format!("{down}"), seed.to_string());
        // A node left on a fork of an earlier round (a lost message, a crash) cannot replay the
        // swarm's next state from its own: it needs a state the swarm's rules attest — by a
        // private swarm's quorum of members, or an open swarm's bootstrap.
        let mut flags = vec![
            "--nodes",
            &nodes_s,
            "--rounds",
            "8",
            "--latency-ms",
            &lat,
            "--jitter-ms",
            &jit,
            "--loss",
            &loss_s,
            "--crash-every-secs",
            &crash_s,
            "--down-secs",
            &down_s,
            // Crashes stop early enough that no node comes back to a swarm that already
            // finished its rounds and left (it would wait for peers, as `nightshift run` does).
            "--crashes-until-secs",
            "20",
            "--seed",
            &seed_s,
        ];
        flags.extend(if private {
            ["--private"].as_slice()
        } else {
            ["--bootstraps", "1"].as_slice()
        });
        if overlap {
            flags.push("--overlap");
        }
        if let Some(r) = reduce {
            flags.extend(["--reduce", r]);
        }
        let r = simulate(&args(&flags)).unwrap();
        prop_assert!(r.summary.failures.is_empty(), "{:?}", r.summary.failures);
        prop_assert_eq!(r.summary.nodes_finished, nodes, "{:?}", r.summary);
        // Every node that completed round r holds the same θ(r): no fork outlived its round —
        // the last one included, which no next round repairs (nodes wait for their peers to
        // finish it, then look once more).
        for row in &r.rounds {
            prop_assert_eq!(row.distinct_state_hashes, 1, "{:?}", row);
        }
        // Progress: the loss at the last round is below where it began.
        let last = r.rounds.last().and_then(|x| x.val_loss).unwrap();
        prop_assert!(last < 0.1, "{}", last);
    }
    Ok(())
}
