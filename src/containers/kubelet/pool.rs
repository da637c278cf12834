//! A driver's devices as `resource.k8s.io/v1` ResourceSlices: one pool per node, named after
//! the node, split into slices within the API's limits (k8s.io/api v0.37.2
//! `resource/v1/types.go`). Pure: the driver says what the pool holds ([`Pool`]), this says how
//! the API server is told it ([`render`]); [`super::api::Publisher`] keeps it published.

use k8s_openapi::api::resource::v1::{CounterSet, Device, ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

/// The most devices one ResourceSlice may hold: `ResourceSliceMaxDevices`; 64 when devices
/// consume counters ([`MAX_COUNTING_DEVICES_PER_SLICE`]).
pub(crate) const MAX_DEVICES_PER_SLICE: usize = 128;
/// The most devices one ResourceSlice holds when they consume counters
/// (`ResourceSliceMaxDevicesWithAdvancedFeatures`).
pub(crate) const MAX_COUNTING_DEVICES_PER_SLICE: usize = 64;
/// The most counter sets one ResourceSlice holds (`ResourceSliceMaxCounterSets`).
pub(crate) const MAX_COUNTER_SETS_PER_SLICE: usize = 8;

/// How to render the slices of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceOptions {
    /// The node (and pool) name.
    pub node: String,
    /// The DRA driver name.
    pub driver: String,
    /// The pool's generation: bumped each time the plugin republishes.
    pub generation: i64,
}

/// What a node's pool holds: its devices, in the order the driver gives them, and the counter
/// sets (KEP-4815) they consume.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pool {
    pub devices: Vec<Device>,
    pub counter_sets: Vec<CounterSet>,
}

impl Pool {
    /// Whether a device consumes counters (and so goes in a slice of at most
    /// [`MAX_COUNTING_DEVICES_PER_SLICE`]).
    fn counting(d: &Device) -> bool {
        d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
    }
}

/// The node's pool as ResourceSlices: one pool named after the node; the devices that consume
/// no counters at most [`MAX_DEVICES_PER_SLICE`] per slice, those that do at most
/// [`MAX_COUNTING_DEVICES_PER_SLICE`], the counter sets in slices of their own (the API allows
/// devices or counter sets in one slice, not both) at most [`MAX_COUNTER_SETS_PER_SLICE`] each;
/// every slice carries the pool's slice count; one empty slice when nothing is published (the
/// pool exists with no devices).
pub(crate) fn render(pool: Pool, opts: &SliceOptions) -> Vec<ResourceSlice> {
    let (counting, plain): (Vec<Device>, Vec<Device>) = pool.devices.into_iter().partition(Pool::counting);
    // Each slice's devices or counter sets.
    type Body = (Option<Vec<Device>>, Option<Vec<CounterSet>>);
    let mut specs: Vec<Body> = Vec::new();
    for c in plain.chunks(MAX_DEVICES_PER_SLICE) {
        specs.push((Some(c.to_vec()), None));
    }
    for c in counting.chunks(MAX_COUNTING_DEVICES_PER_SLICE) {
        specs.push((Some(c.to_vec()), None));
    }
    for c in pool.counter_sets.chunks(MAX_COUNTER_SETS_PER_SLICE) {
        specs.push((None, Some(c.to_vec())));
    }
    if specs.is_empty() {
        specs.push((Some(Vec::new()), None));
    }
    let count = specs.len() as i64;
    specs
        .into_iter()
        .enumerate()
        .map(|(i, (devices, shared_counters))| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(&opts.node, &opts.driver, i)),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_string(),
                    "gpupass".to_string(),
                )])),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: opts.driver.clone(),
                node_name: Some(opts.node.clone()),
                pool: ResourcePool {
                    name: opts.node.clone(),
                    generation: opts.generation,
                    resource_slice_count: count,
                },
                devices,
                shared_counters,
                ..Default::default()
            },
        })
        .collect()
}

/// `<node>-<driver>-<index>`, dots of the driver name kept (a DNS subdomain).
pub(crate) fn slice_name(node: &str, driver: &str, i: usize) -> String {
    format!("{node}-{driver}-{i}")
}

/// The slices as one `kubectl apply -f`-able document (`kind: List`), pretty JSON.
pub fn to_list_json(slices: &[ResourceSlice]) -> serde_json::Value {
    let items: Vec<serde_json::Value> = slices
        .iter()
        .map(|s| {
            let mut v = serde_json::to_value(s).expect("a ResourceSlice serializes");
            // k8s-openapi adds apiVersion and kind when serializing a top-level resource.
            if let Some(o) = v.as_object_mut() {
                o.entry("apiVersion").or_insert("resource.k8s.io/v1".into());
                o.entry("kind").or_insert("ResourceSlice".into());
            }
            v
        })
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items})
}
