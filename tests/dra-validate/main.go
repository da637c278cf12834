// Command dra-validate checks gpupass's DRA output with Kubernetes' own Go code (v0.37.2), for
// tests/it/dra.rs:
//
//	dra-validate slices FILE     a kind: List of ResourceSlices, decoded strictly (unknown
//	                             fields are errors) into k8s.io/api/resource/v1 types and held
//	                             to that package's limits
//	dra-validate metadata FILE   a KEP-5304 metadata file, read by k8s.io/dynamic-resource-
//	                             allocation/devicemetadata (the reader Kubernetes ships) with its
//	                             validation, then as a reader that knows only v1alpha1 would
//
// It prints one OK line, or the problem on stderr with exit status 1.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

func slices(data []byte) (string, error) {
	var list struct {
		Kind  string            `json:"kind"`
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(data, &list); err != nil {
		return "", err
	}
	if list.Kind != "List" {
		return "", fmt.Errorf("kind %q, want List", list.Kind)
	}
	devices := 0
	counters := map[string]map[string]resourcev1.Counter{}
	var consumptions []resourcev1.Device
	for i, raw := range list.Items {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		var s resourcev1.ResourceSlice
		if err := dec.Decode(&s); err != nil {
			return "", fmt.Errorf("item %d: %w", i, err)
		}
		if s.APIVersion != "resource.k8s.io/v1" || s.Kind != "ResourceSlice" {
			return "", fmt.Errorf("item %d: %s %s", i, s.APIVersion, s.Kind)
		}
		if n := len(s.Spec.Devices); n > resourcev1.ResourceSliceMaxDevices {
			return "", fmt.Errorf("%s: %d devices > ResourceSliceMaxDevices %d", s.Name, n, resourcev1.ResourceSliceMaxDevices)
		}
		// KEP-4815: a slice holds devices or counter sets, never both; devices that consume
		// counters make it a slice of at most ResourceSliceMaxDevicesWithAdvancedFeatures.
		if len(s.Spec.Devices) > 0 && len(s.Spec.SharedCounters) > 0 {
			return "", fmt.Errorf("%s: both devices and sharedCounters", s.Name)
		}
		if n := len(s.Spec.SharedCounters); n > resourcev1.ResourceSliceMaxCounterSets {
			return "", fmt.Errorf("%s: %d counter sets > ResourceSliceMaxCounterSets", s.Name, n)
		}
		for _, cs := range s.Spec.SharedCounters {
			if _, dup := counters[cs.Name]; dup {
				return "", fmt.Errorf("counter set %s twice in the pool", cs.Name)
			}
			if n := len(cs.Counters); n > resourcev1.ResourceSliceMaxCountersPerCounterSet {
				return "", fmt.Errorf("counter set %s: %d counters", cs.Name, n)
			}
			counters[cs.Name] = cs.Counters
		}
		consuming := 0
		for _, d := range s.Spec.Devices {
			if len(d.ConsumesCounters) > 0 {
				consuming++
			}
			if n := len(d.ConsumesCounters); n > resourcev1.ResourceSliceMaxDeviceCounterConsumptionsPerDevice {
				return "", fmt.Errorf("%s: %d counter consumptions", d.Name, n)
			}
			consumptions = append(consumptions, d)
		}
		if consuming > 0 && len(s.Spec.Devices) > resourcev1.ResourceSliceMaxDevicesWithAdvancedFeatures {
			return "", fmt.Errorf("%s: %d devices, %d consuming counters > ResourceSliceMaxDevicesWithAdvancedFeatures %d", s.Name, len(s.Spec.Devices), consuming, resourcev1.ResourceSliceMaxDevicesWithAdvancedFeatures)
		}
		if s.Spec.Pool.ResourceSliceCount != int64(len(list.Items)) {
			return "", fmt.Errorf("%s: resourceSliceCount %d for %d slices", s.Name, s.Spec.Pool.ResourceSliceCount, len(list.Items))
		}
		if len(s.Spec.Driver) > resourcev1.DriverNameMaxLength {
			return "", fmt.Errorf("%s: driver name too long", s.Name)
		}
		for _, d := range s.Spec.Devices {
			if n := len(d.Attributes) + len(d.Capacity); n > resourcev1.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
				return "", fmt.Errorf("%s: %d attributes", d.Name, n)
			}
			for k, a := range d.Attributes {
				set := 0
				for _, p := range []bool{a.IntValue != nil, a.BoolValue != nil, a.StringValue != nil, a.VersionValue != nil} {
					if p {
						set++
					}
				}
				if set != 1 {
					return "", fmt.Errorf("%s: %s has %d values", d.Name, k, set)
				}
				if a.StringValue != nil && len(*a.StringValue) > resourcev1.DeviceAttributeMaxValueLength {
					return "", fmt.Errorf("%s: %s longer than %d", d.Name, k, resourcev1.DeviceAttributeMaxValueLength)
				}
				if domain, id, ok := strings.Cut(string(k), "/"); ok && (len(domain) > resourcev1.DeviceMaxDomainLength || len(id) > resourcev1.DeviceMaxIDLength) {
					return "", fmt.Errorf("%s: name %s too long", d.Name, k)
				}
			}
		}
		devices += len(s.Spec.Devices)
	}
	// Every consumed counter exists in the pool, and no device alone needs more than it holds.
	for _, d := range consumptions {
		for _, c := range d.ConsumesCounters {
			set, ok := counters[c.CounterSet]
			if !ok {
				return "", fmt.Errorf("%s consumes from counter set %s, which the pool does not have", d.Name, c.CounterSet)
			}
			for name, want := range c.Counters {
				have, ok := set[name]
				if !ok {
					return "", fmt.Errorf("%s consumes counter %s/%s, which does not exist", d.Name, c.CounterSet, name)
				}
				if want.Value.Cmp(have.Value) > 0 {
					return "", fmt.Errorf("%s consumes %s of %s/%s, which holds %s", d.Name, want.Value.String(), c.CounterSet, name, have.Value.String())
				}
			}
		}
	}
	return fmt.Sprintf("OK slices %d devices %d", len(list.Items), devices), nil
}

func meta(data []byte) (string, error) {
	var internal metadata.DeviceMetadata
	var invalid error
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &internal,
		devicemetadata.DecodeMetadataWithValidationResult(&invalid)); err != nil {
		return "", err
	}
	if invalid != nil {
		return "", fmt.Errorf("validation: %w", invalid)
	}
	// A reader that knows only v1alpha1 (KubeVirt's today) skips the v1beta1 object.
	var old metadatav1alpha1.DeviceMetadata
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &old); err != nil {
		return "", fmt.Errorf("as v1alpha1: %w", err)
	}
	if len(internal.Requests) == 0 || len(internal.Requests[0].Devices) == 0 {
		return "", fmt.Errorf("no devices")
	}
	// KubeVirt's rule: a passthrough device is found by resource.kubernetes.io/pciBusID, a
	// mediated device by mdevUUID; exactly one of them.
	d := internal.Requests[0].Devices[0]
	key := "resource.kubernetes.io/pciBusID"
	if _, ok := d.Attributes["mdevUUID"]; ok {
		if _, both := d.Attributes[resourcev1.QualifiedName(key)]; both {
			return "", fmt.Errorf("%s has both pciBusID and mdevUUID", d.Name)
		}
		key = "mdevUUID"
	}
	bus := d.Attributes[resourcev1.QualifiedName(key)]
	if bus.StringValue == nil {
		return "", fmt.Errorf("%s has no %s", d.Name, key)
	}
	oldBus := old.Requests[0].Devices[0].Attributes[resourcev1.QualifiedName(key)]
	if oldBus.StringValue == nil || *oldBus.StringValue != *bus.StringValue {
		return "", fmt.Errorf("v1alpha1 reader sees another %s", key)
	}
	return fmt.Sprintf("OK metadata %s %s %s %s", internal.Namespace, internal.Name, d.Name, *bus.StringValue), nil
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: dra-validate slices|metadata FILE")
		os.Exit(2)
	}
	data, err := os.ReadFile(os.Args[2])
	if err == nil {
		var line string
		switch os.Args[1] {
		case "slices":
			line, err = slices(data)
		case "metadata":
			line, err = meta(data)
		default:
			err = fmt.Errorf("unknown mode %q", os.Args[1])
		}
		if err == nil {
			fmt.Println(line)
			return
		}
	}
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
