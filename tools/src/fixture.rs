//! The data a run starts from: products with their initial stock and
//! customers with their initial credit, created through the API and saved as
//! JSON so the load generator and the invariant checker agree on it.

use crate::{Api, ToolError};
use futures::stream::{self, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fixture {
    pub products: Vec<FixtureProduct>,
    pub customers: Vec<FixtureCustomer>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FixtureProduct {
    pub id: String,
    pub price_cents: i64,
    pub initial_stock: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FixtureCustomer {
    pub id: String,
    pub initial_credit_cents: i64,
}

/// How much to create. Many products and customers keep rows cold (no single
/// hot row) unless contention is what you measure.
#[derive(Debug, Clone)]
pub struct SeedPlan {
    pub products: usize,
    pub customers: usize,
    pub stock: i64,
    pub credit_cents: i64,
    /// The first `poor_customers` customers get only `poor_credit_cents`, so
    /// their orders soon fail the charge and take the compensation path.
    pub poor_customers: usize,
    pub poor_credit_cents: i64,
}

impl Fixture {
    /// Creates the products and customers (10 calls in flight). SKUs carry a
    /// fresh run tag, so seeding twice never collides.
    pub async fn seed(api: &Api, plan: &SeedPlan) -> Result<Self, ToolError> {
        let tag = uuid::Uuid::now_v7().simple().to_string();
        let products = stream::iter(0..plan.products)
            .map(|i| {
                let sku = format!("load-{tag}-{i}");
                // Prices 1.00 .. 99.00, varied so totals differ per order.
                let price_cents = 100 * (1 + (i as i64 * 37) % 99);
                async move {
                    let id = api.create_product(&sku, price_cents, plan.stock).await?;
                    Ok::<_, ToolError>(FixtureProduct { id, price_cents, initial_stock: plan.stock })
                }
            })
            .buffer_unordered(10)
            .try_collect()
            .await?;
        let customers = stream::iter(0..plan.customers)
            .map(|i| {
                let name = format!("load-{tag}-{i}");
                let credit = if i < plan.poor_customers { plan.poor_credit_cents } else { plan.credit_cents };
                async move {
                    let id = api.create_customer(&name, credit).await?;
                    Ok::<_, ToolError>(FixtureCustomer { id, initial_credit_cents: credit })
                }
            })
            .buffer_unordered(10)
            .try_collect()
            .await?;
        Ok(Self { products, customers })
    }

    pub fn save(&self, path: &Path) -> Result<(), ToolError> {
        let json = serde_json::to_vec_pretty(self)
            .map_err(|source| ToolError::Json { path: path.display().to_string(), source })?;
        std::fs::write(path, json).map_err(|e| ToolError::io(path, e))
    }

    pub fn load(path: &Path) -> Result<Self, ToolError> {
        let bytes = std::fs::read(path).map_err(|e| ToolError::io(path, e))?;
        serde_json::from_slice(&bytes)
            .map_err(|source| ToolError::Json { path: path.display().to_string(), source })
    }
}
