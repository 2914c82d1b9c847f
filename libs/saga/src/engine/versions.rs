//! The versions of a saga one binary drives ([`Versions`]), and the check that a
//! deploy neither strands an instance nor reads it through a changed shape
//! ([`Engine::register`]).
//!
//! Every instance records the version it started on; a driver reads it through that
//! version's definition, whatever the newest is. New instances start on the newest, or
//! on `saga.start_version` ([`Engine::versions`] says which).
//! `saga_versions` keeps, per saga and version, the fingerprint of the shape the
//! version had when a host first registered it (docs/design.md, "Changing a saga").

use super::Engine;
use crate::definition::Definition;
use crate::step::Saga;
use std::collections::BTreeMap;

/// The definitions of one saga a binary can drive, one per version: the newest starts
/// new instances, the older ones finish the instances that started on them.
///
/// ```ignore
/// Versions::new(place_order_v2(..)).and(place_order_v1(..))
/// ```
pub struct Versions<S: Saga> {
    /// As declared; [`Versions::sorted`] puts the newest first.
    pub(crate) definitions: Vec<Definition<S>>,
}

impl<S: Saga> Versions<S> {
    pub fn new(definition: Definition<S>) -> Self {
        Self { definitions: vec![definition] }
    }

    /// Also drives the instances of `older`'s version.
    pub fn and(mut self, older: Definition<S>) -> Self {
        self.definitions.push(older);
        self
    }

    /// Each version's shape, newest first: e.g. to generate every version's fault
    /// matrix (`testing::trials`).
    pub fn shapes(&self) -> Vec<crate::definition::Shape> {
        let mut shapes: Vec<_> = self.definitions.iter().map(Definition::shape).collect();
        shapes.sort_by_key(|s| std::cmp::Reverse(s.version));
        shapes
    }

    /// Sorted newest first; two definitions of one version are an error.
    pub(crate) fn sorted(mut self) -> Result<Vec<Definition<S>>, String> {
        self.definitions.sort_by_key(|d| std::cmp::Reverse(d.version));
        if let Some(w) = self.definitions.windows(2).find(|w| w[0].version == w[1].version) {
            return Err(format!("saga {:?}: version {} is declared twice", S::NAME, w[0].version));
        }
        Ok(self.definitions)
    }
}

impl<S: Saga> From<Definition<S>> for Versions<S> {
    fn from(definition: Definition<S>) -> Self {
        Self::new(definition)
    }
}

/// Why [`Engine::register`] refused to drive a saga.
#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    #[error(
        "saga {saga:?}: the database holds unfinished instances of version(s) this binary does not register: {}; \
         deploy a binary that still declares them (Versions::and) and let them finish \
         (`sagaworks-admin sagas versions`), or set saga.force_start to leave them undrivable",
        counts(.unregistered)
    )]
    Unregistered { saga: &'static str, unregistered: BTreeMap<i32, i64> },
    #[error(
        "saga {saga:?}: version {version}'s shape changed (fingerprint {stored} when first registered, {now} now) \
         while {unfinished} instance(s) of it are unfinished; declare the change as a new version, or set \
         saga.force_start to read them through the new shape"
    )]
    ShapeChanged { saga: &'static str, version: i32, stored: String, now: String, unfinished: i64 },
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// A version of a saga as one replica sees it ([`Engine::versions`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VersionStatus {
    pub version: u32,
    /// Instances started on it and not finished.
    pub unfinished: u64,
    /// Its fingerprint when it was first registered (empty: never registered, e.g.
    /// instances written before versions existed).
    pub fingerprint: String,
    /// This replica can drive its instances.
    pub registered: bool,
    /// This replica starts new instances on it (`saga.start_version`, or the newest).
    pub starts_new: bool,
}

/// Per version of saga `saga` that is recorded in `saga_versions` or has an unfinished
/// instance: its unfinished instances and its recorded fingerprint.
async fn recorded<'c>(
    db: impl sqlx::PgExecutor<'c>,
    saga: &str,
) -> Result<BTreeMap<i32, (i64, Option<String>)>, sqlx::Error> {
    Ok(sqlx::query_as::<_, (i32, i64, Option<String>)>(
        "WITH unfinished AS (
             SELECT version, count(*) AS n FROM saga_instances
             WHERE saga_type = $1 AND status IN ('RUNNING', 'COMPENSATING') GROUP BY version)
         SELECT v.version, COALESCE(u.n, 0), r.fingerprint
         FROM (SELECT version FROM saga_versions WHERE saga_type = $1
               UNION SELECT version FROM unfinished) v
         LEFT JOIN unfinished u ON u.version = v.version
         LEFT JOIN saga_versions r ON r.saga_type = $1 AND r.version = v.version",
    )
    .bind(saga)
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|(v, n, f)| (v, (n, f)))
    .collect())
}

fn counts(versions: &BTreeMap<i32, i64>) -> String {
    versions.iter().map(|(v, n)| format!("v{v}: {n}")).collect::<Vec<_>>().join(", ")
}

impl<S: Saga> Engine<S> {
    /// Every version of this saga that a host registered, this replica declares, or an
    /// unfinished instance started on: newest first, with its unfinished instances. A
    /// version at 0 that does not start new instances is drained: its code may go.
    pub async fn versions(&self) -> Result<Vec<VersionStatus>, sqlx::Error> {
        let mut rows = recorded(self.pool(), S::NAME).await?;
        for def in self.definitions() {
            rows.entry(def.version() as i32).or_insert((0, None));
        }
        let starting = self.definition().version();
        Ok(rows
            .into_iter()
            .rev()
            .map(|(version, (unfinished, fingerprint))| VersionStatus {
                version: version.max(0) as u32,
                unfinished: unfinished.max(0) as u64,
                fingerprint: fingerprint.unwrap_or_default(),
                registered: self.definition_of(version).is_some(),
                starts_new: version as u32 == starting,
            })
            .collect())
    }

    /// Records this binary's versions and their fingerprints, and refuses (unless
    /// `saga.force_start`) when unfinished instances in the database started on a
    /// version it does not register, or on a registered version whose shape changed
    /// since it was first registered. A host calls it at start-up, before it serves.
    pub async fn register(&self) -> Result<(), VersionError> {
        let force = self.settings().force_start;
        let mut tx = self.pool().begin().await?;
        // One registration at a time per saga (replicas start together).
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('sagaworks.saga_versions'), hashtext($1))")
            .bind(S::NAME)
            .execute(&mut *tx)
            .await?;
        let recorded = recorded(&mut *tx, S::NAME).await?;
        let unregistered: BTreeMap<i32, i64> = recorded
            .iter()
            .filter(|(v, (n, _))| *n > 0 && self.definition_of(**v).is_none())
            .map(|(v, (n, _))| (*v, *n))
            .collect();
        if !unregistered.is_empty() {
            if !force {
                return Err(VersionError::Unregistered { saga: S::NAME, unregistered });
            }
            tracing::warn!(saga = S::NAME, versions = %counts(&unregistered),
                "saga.force_start: unfinished instances of unregistered versions stay undrivable");
        }
        for def in self.definitions() {
            let version = def.version() as i32;
            let now = def.fingerprint();
            let shape = serde_json::to_value(def.shape()).unwrap_or_default();
            let (count, stored) = recorded.get(&version).cloned().unwrap_or((0, None));
            match stored {
                Some(stored) if stored == now => continue,
                Some(stored) => {
                    if count > 0 && !force {
                        return Err(VersionError::ShapeChanged {
                            saga: S::NAME,
                            version,
                            stored,
                            now,
                            unfinished: count,
                        });
                    }
                    tracing::warn!(saga = S::NAME, version, %stored, %now, unfinished = count,
                        "a changed shape under an unchanged version: recorded");
                }
                None => {}
            }
            sqlx::query(
                "INSERT INTO saga_versions (saga_type, version, fingerprint, shape) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (saga_type, version)
                 DO UPDATE SET fingerprint = excluded.fingerprint, shape = excluded.shape, registered_at = now()",
            )
            .bind(S::NAME)
            .bind(version)
            .bind(&now)
            .bind(shape)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
