//! The coordinator's plan: which member should lead each shard, and how the coordinator
//! decides it. A plan only says where to look: a member takes a shard of its plan by the
//! shard record's rules (`docs/sharding.md`), never because the plan says so, and gives up
//! the shards the plan gives to others by releasing them. A stale plan costs a poll, never a
//! shard led twice.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::records::ShardSet;
use crate::error::Error;
use crate::model::{HolderId, ObjectName};

/// The plan as the coordinator writes it in the plan object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Plan {
    pub(crate) v: u32,
    /// Rises with every plan written under a key (also across coordinators: a new one goes on
    /// from the plan it finds).
    pub(crate) version: u64,
    pub(crate) shards: u32,
    /// The coordinator that wrote it, and its coordinator term.
    pub(crate) by: HolderId,
    pub(crate) term: u64,
    /// The roster's creation mark when the plan was made: a member that joined another roster
    /// (it was deleted and written again) joins again.
    pub(crate) roster: u64,
    /// The members the coordinator counts live, each with the shards it should lead.
    pub(crate) members: Vec<Share>,
    /// The longest ttl of any member the coordinator has seen, in milliseconds (0: not
    /// known): a member that has read no other member's record waits that long for a term
    /// to end.
    #[serde(default)]
    pub(crate) ttl_ms: u64,
    /// Written once the coordinator had seen the roster it names for a ttl after announcing a
    /// plan that names it: every live member has listed itself in it since, so an instance
    /// that reads this plan may trust that roster at once.
    #[serde(default)]
    pub(crate) settled: bool,
}

/// One member's share of a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Share {
    pub(crate) id: HolderId,
    /// As [`ShardSet::encode`].
    pub(crate) shards: String,
}

impl Plan {
    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub(crate) fn decode(name: &ObjectName, bytes: &[u8]) -> Result<Self, Error> {
        serde_json::from_slice(bytes).map_err(|e| Error::MalformedRecord {
            key: name.to_string(),
            detail: format!(
                "it is not a sharded election's plan ({e}); another program wrote it, or it \
                 was damaged: delete it (the coordinator writes it again)"
            ),
        })
    }

    /// The shares by member, decoded (a share that does not decode counts as empty).
    pub(crate) fn shares(&self) -> Vec<(HolderId, ShardSet)> {
        self.members
            .iter()
            .map(|s| {
                let set = ShardSet::decode(self.shards, &s.shards)
                    .unwrap_or_else(|| ShardSet::new(self.shards));
                (s.id.clone(), set)
            })
            .collect()
    }

    /// The shards `id` should lead, if the plan counts it.
    pub(crate) fn share_of(&self, id: &HolderId) -> Option<ShardSet> {
        self.members.iter().find(|s| s.id == *id).map(|s| {
            ShardSet::decode(self.shards, &s.shards).unwrap_or_else(|| ShardSet::new(self.shards))
        })
    }
}

/// A live member as the coordinator sees it: its id, and the shards it claims.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) id: HolderId,
    pub(crate) claims: ShardSet,
}

/// Decides who should lead each of the `n` shards among the live `members`; returns one set
/// per member, in their order. In this order of precedence, a shard goes to:
/// 1. the member it is `pinned` to (its record names that member's live term: the member
///    adopts it);
/// 2. the live member the `previous` plan gave it to (a move still under way);
/// 3. the first live member that claims it;
///
/// then the counts are evened out, as few shards moving as can be: the members that lead the
/// most keep `ceil(n / L)` (as many as `n mod L` calls for), the others `floor(n / L)`; a
/// member above its target gives up its highest-numbered shards, one below takes the
/// lowest-numbered shards that nobody has (so that the shares stay ranges, and the plan
/// small).
pub(crate) fn allot(
    n: u32,
    members: &[Seen],
    previous: &[(HolderId, ShardSet)],
    pinned: &BTreeMap<u32, HolderId>,
) -> Vec<ShardSet> {
    let mut shares: Vec<ShardSet> = members.iter().map(|_| ShardSet::new(n)).collect();
    if members.is_empty() {
        return shares;
    }
    let index: BTreeMap<&HolderId, usize> = members
        .iter()
        .enumerate()
        .map(|(i, m)| (&m.id, i))
        .collect();
    let planned: BTreeMap<u32, usize> = previous
        .iter()
        .filter_map(|(id, set)| index.get(id).map(|i| (*i, set)))
        .flat_map(|(i, set)| set.iter().map(move |s| (s, i)))
        .collect();
    let mut owner: Vec<Option<usize>> = vec![None; n as usize];
    for (s, slot) in owner.iter_mut().enumerate() {
        let s = s as u32;
        *slot = pinned
            .get(&s)
            .and_then(|id| index.get(id).copied())
            .or_else(|| planned.get(&s).copied())
            .or_else(|| members.iter().position(|m| m.claims.contains(s)));
    }
    let mut counts = vec![0usize; members.len()];
    for i in owner.iter().flatten() {
        counts[*i] += 1;
    }
    // The targets: the members that lead the most get the extra shard of `n mod L`.
    let lo = n as usize / members.len();
    let extra = n as usize % members.len();
    let mut order: Vec<usize> = (0..members.len()).collect();
    order.sort_by_key(|i| (std::cmp::Reverse(counts[*i]), *i));
    let mut target = vec![lo; members.len()];
    for i in order.iter().take(extra) {
        target[*i] = lo + 1;
    }
    // Above target: give up the highest-numbered shards, pinned ones last (a pin is there
    // because no other member could take the shard).
    for pinned_pass in [false, true] {
        for s in (0..n).rev() {
            if let Some(i) = owner[s as usize]
                && counts[i] > target[i]
                && pinned.contains_key(&s) == pinned_pass
            {
                owner[s as usize] = None;
                counts[i] -= 1;
            }
        }
    }
    // Below target: take the lowest-numbered shards nobody has.
    let below: Vec<usize> = (0..members.len())
        .filter(|i| counts[*i] < target[*i])
        .collect();
    let mut takers = below.into_iter();
    let mut taker = takers.next();
    for slot in owner.iter_mut() {
        let Some(i) = taker else { break };
        if slot.is_none() {
            *slot = Some(i);
            counts[i] += 1;
            if counts[i] >= target[i] {
                taker = takers.next();
            }
        }
    }
    for (s, o) in owner.iter().enumerate() {
        if let Some(i) = o {
            shares[*i].insert(s as u32);
        }
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> HolderId {
        HolderId::new(s).unwrap()
    }

    fn set(n: u32, shards: impl IntoIterator<Item = u32>) -> ShardSet {
        let mut set = ShardSet::new(n);
        for s in shards {
            set.insert(s);
        }
        set
    }

    fn seen(name: &str, claims: ShardSet) -> Seen {
        Seen {
            id: id(name),
            claims,
        }
    }

    fn counts(shares: &[ShardSet]) -> Vec<usize> {
        shares.iter().map(ShardSet::len).collect()
    }

    #[test]
    fn one_member_gets_every_shard_and_a_joiner_the_upper_half() {
        let n = 10;
        let alone = allot(n, &[seen("a", set(n, []))], &[], &BTreeMap::new());
        assert_eq!(alone[0], set(n, 0..10));
        assert_eq!(alone[0].encode(), "r:0-9");
        let two = allot(
            n,
            &[seen("a", set(n, 0..10)), seen("b", set(n, []))],
            &[],
            &BTreeMap::new(),
        );
        assert_eq!(two[0], set(n, 0..5));
        assert_eq!(two[1], set(n, 5..10));
    }

    #[test]
    fn counts_end_within_one_and_as_few_shards_move_as_can() {
        let n = 7;
        let members = [
            seen("a", set(n, 0..5)),
            seen("b", set(n, 5..7)),
            seen("c", set(n, [])),
        ];
        let shares = allot(n, &members, &[], &BTreeMap::new());
        assert_eq!(counts(&shares), [3, 2, 2]);
        // a keeps 0..3 (the most, so the extra one), b keeps its two, c gets a's 3 and 4.
        assert_eq!(shares[0], set(n, 0..3));
        assert_eq!(shares[1], set(n, 5..7));
        assert_eq!(shares[2], set(n, 3..5));
        // Nothing changes hands once balanced.
        let again: Vec<Seen> = members
            .iter()
            .zip(&shares)
            .map(|(m, s)| seen(m.id.as_str(), s.clone()))
            .collect();
        assert_eq!(allot(n, &again, &[], &BTreeMap::new()), shares);
    }

    #[test]
    fn a_move_under_way_stays_planned_and_a_pin_wins() {
        let n = 4;
        // a still claims 3, which the previous plan gave to b: it stays b's.
        let members = [seen("a", set(n, 0..4)), seen("b", set(n, []))];
        let previous = [(id("a"), set(n, 0..2)), (id("b"), set(n, 2..4))];
        let shares = allot(n, &members, &previous, &BTreeMap::new());
        assert_eq!(shares[1], set(n, 2..4));
        // A pin (its record names b's live term) outranks claims and the previous plan, and
        // is the last shard given up to even the counts out.
        let pinned = BTreeMap::from([(0, id("b"))]);
        let shares = allot(n, &members, &previous, &pinned);
        assert!(shares[1].contains(0), "{:?}", shares[1]);
        assert_eq!(counts(&shares), [2, 2]);
        let pinned = BTreeMap::from([(3, id("a"))]);
        let shares = allot(
            n,
            &[seen("a", set(n, 0..2)), seen("b", set(n, 2..4))],
            &[],
            &pinned,
        );
        assert!(shares[0].contains(3), "{:?}", shares[0]);
        assert_eq!(counts(&shares), [2, 2]);
    }

    #[test]
    fn the_shards_of_a_member_gone_go_to_the_others() {
        let n = 6;
        let previous = [
            (id("a"), set(n, 0..2)),
            (id("b"), set(n, 2..4)),
            (id("c"), set(n, 4..6)),
        ];
        let members = [seen("a", set(n, 0..2)), seen("c", set(n, 4..6))];
        let shares = allot(n, &members, &previous, &BTreeMap::new());
        assert_eq!(counts(&shares), [3, 3]);
        assert_eq!(shares[0], set(n, 0..3));
        assert_eq!(shares[1], set(n, [3, 4, 5]));
        assert!(allot(n, &[], &previous, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn a_plan_round_trips_and_a_damaged_one_is_reported() {
        let plan = Plan {
            v: 1,
            version: 3,
            shards: 8,
            by: id("a"),
            term: 2,
            roster: 77,
            members: vec![Share {
                id: id("a"),
                shards: set(8, 0..8).encode(),
            }],
            ttl_ms: 15_000,
            settled: true,
        };
        let name = ObjectName::new("k.plan").unwrap();
        let back = Plan::decode(&name, &plan.encode()).unwrap();
        assert_eq!(back, plan);
        assert_eq!(back.share_of(&id("a")), Some(set(8, 0..8)));
        assert_eq!(back.share_of(&id("z")), None);
        let e = Plan::decode(&name, b"{not json").unwrap_err();
        assert!(e.to_string().contains("k.plan"), "{e}");
    }
}
