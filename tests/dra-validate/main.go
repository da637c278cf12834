// Command dra-validate checks gpupass's DRA output with Kubernetes' own Go code (v0.37.2), for
// tests/it/dra.rs:
//
//	dra-validate slices FILE     a kind: List of ResourceSlices, decoded strictly (unknown
//	                             fields are errors) into k8s.io/api/resource/v1 types and held
//	                             to that package's limits
//	dra-validate metadata FILE   a KEP-5304 metadata file, read by k8s.io/dynamic-resource-
//	                             allocation/devicemetadata (the reader Kubernetes ships) with its
//	                             validation, then as a reader that knows only v1alpha1 would
//	dra-validate cel FILE YAML.. the CEL selectors of the DeviceClasses and ResourceClaimTemplates
//	                             in the YAML files (contrib/dra), compiled and evaluated by
//	                             k8s.io/dynamic-resource-allocation/cel (the scheduler's own) on
//	                             every device of the slices in FILE, as the allocator does: a
//	                             class's selectors first, the request's only where they match;
//	                             any compile or evaluation error (an absent attribute read) is
//	                             the problem; prints each template's matching device count
//
// It prints one OK line, or the problem on stderr with exit status 1.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	draCEL "k8s.io/dynamic-resource-allocation/cel"
	"sigs.k8s.io/yaml"
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

// The slices of a kind: List, decoded strictly.
func sliceList(data []byte) ([]resourcev1.ResourceSlice, error) {
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, err
	}
	var out []resourcev1.ResourceSlice
	for i, raw := range list.Items {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		var s resourcev1.ResourceSlice
		if err := dec.Decode(&s); err != nil {
			return nil, fmt.Errorf("item %d: %w", i, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// One selector evaluated on one device: whether it matches.
func matches(expr string, slice *resourcev1.ResourceSlice, d *resourcev1.Device) (bool, error) {
	r := draCEL.GetCompiler(draCEL.Features{}).CompileCELExpression(expr, draCEL.Options{})
	if r.Error != nil {
		return false, fmt.Errorf("compile %q: %w", expr, r.Error)
	}
	ok, _, err := r.DeviceMatches(context.Background(), draCEL.Device{
		Driver:     slice.Spec.Driver,
		Attributes: d.Attributes,
		Capacity:   d.Capacity,
	})
	if err != nil {
		return false, fmt.Errorf("device %s: %q: %w", d.Name, expr, err)
	}
	return ok, nil
}

func celCheck(data []byte, yamls []string) (string, error) {
	slices, err := sliceList(data)
	if err != nil {
		return "", err
	}
	classes := map[string]resourcev1.DeviceClass{}
	type template struct {
		name string
		spec resourcev1.ResourceClaimSpec
	}
	var templates []template
	for _, f := range yamls {
		text, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		for _, doc := range strings.Split("\n"+string(text), "\n---") {
			var head struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				return "", fmt.Errorf("%s: %w", f, err)
			}
			switch head.Kind {
			case "DeviceClass":
				var c resourcev1.DeviceClass
				if err := yaml.UnmarshalStrict([]byte(doc), &c); err != nil {
					return "", fmt.Errorf("%s: %s: %w", f, head.Metadata.Name, err)
				}
				classes[c.Name] = c
			case "ResourceClaimTemplate":
				var t resourcev1.ResourceClaimTemplate
				if err := yaml.UnmarshalStrict([]byte(doc), &t); err != nil {
					return "", fmt.Errorf("%s: %s: %w", f, head.Metadata.Name, err)
				}
				templates = append(templates, template{t.Name, t.Spec.Spec})
			case "":
			default:
				return "", fmt.Errorf("%s: unexpected kind %s", f, head.Kind)
			}
		}
	}
	if len(templates) == 0 {
		return "", fmt.Errorf("no ResourceClaimTemplate in %v", yamls)
	}
	var counts []string
	for _, t := range templates {
		n := 0
		for _, req := range t.spec.Devices.Requests {
			if req.Exactly == nil {
				return "", fmt.Errorf("%s: request %s has no exactly", t.name, req.Name)
			}
			class, ok := classes[req.Exactly.DeviceClassName]
			if !ok {
				return "", fmt.Errorf("%s: no DeviceClass %s", t.name, req.Exactly.DeviceClassName)
			}
			for si := range slices {
				for di := range slices[si].Spec.Devices {
					d := &slices[si].Spec.Devices[di]
					all := true
					for _, sel := range append(append([]resourcev1.DeviceSelector{}, class.Spec.Selectors...), req.Exactly.Selectors...) {
						if sel.CEL == nil {
							continue
						}
						ok, err := matches(sel.CEL.Expression, &slices[si], d)
						if err != nil {
							return "", fmt.Errorf("template %s: %w", t.name, err)
						}
						if !ok {
							all = false
							break
						}
					}
					if all {
						n++
					}
				}
			}
		}
		counts = append(counts, fmt.Sprintf("%s=%d", t.name, n))
	}
	sort.Strings(counts)
	return "OK cel " + strings.Join(counts, " "), nil
}

func main() {
	if len(os.Args) < 3 || (os.Args[1] != "cel" && len(os.Args) != 3) {
		fmt.Fprintln(os.Stderr, "usage: dra-validate slices|metadata FILE | dra-validate cel FILE YAML...")
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
		case "cel":
			line, err = celCheck(data, os.Args[3:])
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
