package rls

import (
	"os"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // @type in the snippets
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3" // @type in the snippets
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	"sigs.k8s.io/yaml"
)

// block is the fenced block of docs/envoy.md whose first line is marker.
func block(t *testing.T, marker string) []byte {
	t.Helper()
	doc, err := os.ReadFile("../../../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```yaml\n"+marker+"\n")
	if !ok {
		t.Fatalf("docs/envoy.md has no yaml block starting %q", marker)
	}
	body, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatalf("block %q is not closed", marker)
	}
	return []byte(body)
}

// decode reads YAML into m as protojson does JSON (unknown fields refused).
func decode(t *testing.T, y []byte, m proto.Message) {
	t.Helper()
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(j, m); err != nil {
		t.Fatalf("decode %T: %v", m, err)
	}
}

// validate calls ValidateAll on m, and on every Any (typed_config) inside
// it unpacked into its type (ValidateAll stops at an Any), so the filters'
// own rules are checked, not only the envelope's. It returns how many Anys
// it unpacked.
func validate(t *testing.T, m proto.Message, path string) int {
	t.Helper()
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
	return anys(t, m, path)
}

// anys validates the Anys inside m.
func anys(t *testing.T, m proto.Message, path string) int {
	t.Helper()
	n := 0
	if a, ok := m.(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			t.Errorf("%s: %v", path, err)
			return 0
		}
		return 1 + validate(t, inner, path+"("+a.TypeUrl+")")
	}
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() == nil {
			return true
		}
		name := path + "." + string(fd.Name())
		switch {
		case fd.IsList():
			for i := range v.List().Len() {
				n += anys(t, v.List().Get(i).Message().Interface(), name)
			}
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					n += anys(t, mv.Message().Interface(), name)
					return true
				})
			}
		default:
			n += anys(t, v.Message().Interface(), name)
		}
		return true
	})
	return n
}

// The Envoy bootstrap of docs/envoy.md is valid Envoy configuration as
// go-control-plane checks it, and its ratelimit filter and actions ask
// this service for the domain its rules block loads.
func TestDocsEnvoyBootstrapValidates(t *testing.T) {
	var bs bootstrapv3.Bootstrap
	decode(t, block(t, "# envoy: bootstrap"), &bs)
	if n := validate(t, &bs, "bootstrap"); n < 4 {
		t.Fatalf("%d typed configs checked, want the HCM, ratelimit, router and protocol options", n)
	}
	hcm := &hcmv3.HttpConnectionManager{}
	if err := bs.StaticResources.Listeners[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	rl := &ratelimitv3.RateLimit{}
	if err := hcm.HttpFilters[0].GetTypedConfig().UnmarshalTo(rl); err != nil {
		t.Fatal(err)
	}
	if got := rl.RateLimitService.GrpcService.GetEnvoyGrpc().GetClusterName(); got != bs.StaticResources.Clusters[0].Name {
		t.Fatalf("the filter calls cluster %q, the first cluster is %q", got, bs.StaticResources.Clusters[0].Name)
	}
	rules, err := Parse(block(t, "# rls: rules"))
	if err != nil {
		t.Fatal(err)
	}
	if rules.domains[rl.Domain] == nil {
		t.Fatalf("the rules have no domain %q", rl.Domain)
	}
	// The descriptors the actions make match limits of the rules.
	for _, want := range [][]string{{"remote_address", "10.0.0.1"}, {"generic_key", "checkout"}} {
		if l, _ := limitOf(rules, rl.Domain, d(want...)); l == nil {
			t.Errorf("descriptor %v matches no limit", want)
		}
	}
}

// The Istio EnvoyFilter decodes into istio.io/api's type, and its patches
// into Envoy's types, which validate.
func TestDocsIstioEnvoyFilterValidates(t *testing.T) {
	var obj struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Spec       map[string]any `json:"spec"`
	}
	// metadata is Kubernetes', not istio.io/api's: not decoded.
	if err := yaml.Unmarshal(block(t, "# istio: EnvoyFilter"), &obj); err != nil {
		t.Fatal(err)
	}
	if obj.APIVersion != "networking.istio.io/v1alpha3" || obj.Kind != "EnvoyFilter" {
		t.Fatalf("apiVersion %q kind %q", obj.APIVersion, obj.Kind)
	}
	spec, err := yaml.Marshal(obj.Spec)
	if err != nil {
		t.Fatal(err)
	}
	var ef networkingv1alpha3.EnvoyFilter
	decode(t, spec, &ef)
	if len(ef.ConfigPatches) != 2 {
		t.Fatalf("%d patches", len(ef.ConfigPatches))
	}
	for i, p := range ef.ConfigPatches {
		j, err := protojson.Marshal(p.Patch.Value)
		if err != nil {
			t.Fatal(err)
		}
		switch p.ApplyTo {
		case networkingv1alpha3.EnvoyFilter_HTTP_FILTER:
			var f hcmv3.HttpFilter
			if err := protojson.Unmarshal(j, &f); err != nil {
				t.Fatalf("patch %d: %v", i, err)
			}
			if n := validate(t, &f, "patch"); n != 1 || f.Name != "envoy.filters.http.ratelimit" {
				t.Fatalf("patch %d: %s with %d typed configs", i, f.Name, n)
			}
		case networkingv1alpha3.EnvoyFilter_VIRTUAL_HOST:
			// A MERGE carries part of a virtual host: check what it adds.
			var vh routev3.VirtualHost
			if err := protojson.Unmarshal(j, &vh); err != nil {
				t.Fatalf("patch %d: %v", i, err)
			}
			if len(vh.RateLimits) == 0 {
				t.Fatalf("patch %d adds no rate_limits", i)
			}
			for _, rl := range vh.RateLimits {
				validate(t, rl, "rate_limits")
			}
		default:
			t.Fatalf("patch %d applies to %v", i, p.ApplyTo)
		}
	}
}
