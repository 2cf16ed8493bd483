//! Mutual TLS between members: a group talks over it, and a member whose certificate does not
//! chain to the group's CA (or does not name its host) is refused both ways.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::time::Duration;

use leader_core::{ErrorKind, LeaseBackend, LeaseKey};
use leader_raft::TlsConfig;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use support::Group;
use tokio::time::sleep;

struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        Self(CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap())
    }

    /// A member's TLS material: a certificate naming `names`, signed by this CA, trusting
    /// `trusted`.
    fn member(&self, names: &[&str], trusted: &Ca) -> TlsConfig {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &self.0)
            .unwrap();
        TlsConfig::from_pem(trusted.0.pem(), cert.pem(), key.serialize_pem())
    }
}

fn host(address: &str) -> &str {
    address.rsplit_once(':').unwrap().0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_elect_and_answer_over_mutual_tls() {
    let ca = Ca::new("group CA");
    let mut group = Group::start_with(3, |a| Some(ca.member(&[host(a)], &ca))).await;
    let leader = group.leader(Duration::from_secs(10)).await;
    let follower = group.member((leader + 1) % 3).clone();
    let key = LeaseKey::new("over-tls").unwrap();
    assert_eq!(follower.read(&key).await.unwrap(), None);
    follower.put_raw(&key, b"raw".to_vec()).await.unwrap();
    let status = follower
        .status_of(&group.addresses[(leader + 2) % 3])
        .await
        .unwrap();
    assert_eq!(status.leader, follower.status().leader);
    group.shutdown_all().await;
}

/// Member 2 of a group is `rogue`: the other two elect a leader and answer without it, and it
/// is refused both ways.
async fn rogue_member_is_refused(rogue: impl Fn(&Ca, &str) -> TlsConfig) {
    let ca = Ca::new("group CA");
    let mut group = Group::start_with(3, |a| Some(ca.member(&[host(a)], &ca))).await;
    // Restart member 2 with the rogue material.
    group.stop(2).await;
    group.tls[2] = Some(rogue(&ca, host(&group.addresses[2])));
    group.restart(2).await;
    group.leader_among(&[0, 1], Duration::from_secs(10)).await;
    let good = group.member(0).clone();
    let key = LeaseKey::new("good").unwrap();
    good.put_raw(&key, b"raw".to_vec()).await.unwrap();
    let rogue = group.member(2).clone();
    // Refused at the handshake (unavailable), or after it by the certificate's name check
    // (a configuration error that says so).
    let err = rogue.status_of(&group.addresses[0]).await.unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::Unavailable | ErrorKind::InvalidConfig
        ),
        "{err}"
    );
    let err = good.status_of(&group.addresses[2]).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    sleep(Duration::from_secs(1)).await;
    // The rogue hears from nobody: whatever it believes (a former Raft leader restores itself
    // as one at start), the others do not follow it and it cannot read.
    let rogue_id = Some(rogue.status().id);
    assert_ne!(group.member(0).status().leader, rogue_id);
    assert_ne!(group.member(1).status().leader, rogue_id);
    assert!(rogue.read(&key).await.is_err());
    group.shutdown_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_a_certificate_from_another_ca_is_refused() {
    rogue_member_is_refused(|ca, host| Ca::new("another CA").member(&[host], ca)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_certificate_names_another_host_is_refused() {
    rogue_member_is_refused(|ca, _| ca.member(&["other.example"], ca)).await;
}
