package rls

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
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

// The Envoy Gateway resources of docs/envoy.md decode into Envoy Gateway's
// own types with no unknown field, use only the values its CRD allows for
// the fields it restricts to a set, and each patch's value decodes into
// the Envoy type its path leads to and validates; the filter calls the
// cluster the policy adds, with the domain the rules load. Not checked:
// the API server's CEL rules, and that the paths exist in the xDS Envoy
// Gateway generates (docs/envoy.md says so).
func TestDocsEnvoyGatewayValidates(t *testing.T) {
	var eg egv1a1.EnvoyGateway
	if err := yaml.UnmarshalStrict(block(t, "# envoy-gateway: EnvoyGateway"), &eg); err != nil {
		t.Fatalf("EnvoyGateway: %v", err)
	}
	if eg.Kind != "EnvoyGateway" || eg.APIVersion != egv1a1.GroupVersion.String() {
		t.Fatalf("EnvoyGateway: kind %q apiVersion %q", eg.Kind, eg.APIVersion)
	}
	if eg.ExtensionAPIs == nil || !eg.ExtensionAPIs.EnableEnvoyPatchPolicy {
		t.Fatal("EnvoyGateway does not turn EnvoyPatchPolicy on")
	}

	var epp egv1a1.EnvoyPatchPolicy
	if err := yaml.UnmarshalStrict(block(t, "# envoy-gateway: EnvoyPatchPolicy"), &epp); err != nil {
		t.Fatalf("EnvoyPatchPolicy: %v", err)
	}
	if epp.Kind != egv1a1.KindEnvoyPatchPolicy || epp.APIVersion != egv1a1.GroupVersion.String() {
		t.Fatalf("EnvoyPatchPolicy: kind %q apiVersion %q", epp.Kind, epp.APIVersion)
	}
	spec := epp.Spec
	// The CRD's enums (kubebuilder:validation:Enum), from the module.
	if spec.Type != egv1a1.JSONPatchEnvoyPatchType {
		t.Fatalf("type %q", spec.Type)
	}
	if spec.TargetRef.Kind != "Gateway" || spec.TargetRef.Group != "gateway.networking.k8s.io" {
		t.Fatalf("targetRef %+v: want a Gateway", spec.TargetRef)
	}
	// Envoy Gateway's default listener name: <namespace>/<gateway>/<listener>.
	gw := epp.Namespace + "/" + string(spec.TargetRef.Name) + "/"
	types := []egv1a1.EnvoyResourceType{egv1a1.ListenerEnvoyResourceType, egv1a1.RouteConfigurationEnvoyResourceType,
		egv1a1.ClusterEnvoyResourceType, egv1a1.ClusterLoadAssignmentEnvoyResourceType, egv1a1.SecretEnvoyResourceType}
	ops := []egv1a1.JSONPatchOperationType{"add", "remove", "replace", "move", "copy", "test"}
	var filter *ratelimitv3.RateLimit
	var cluster *clusterv3.Cluster
	actions := 0
	for i, p := range spec.JSONPatches {
		if !slices.Contains(types, p.Type) || !slices.Contains(ops, p.Operation.Op) {
			t.Fatalf("patch %d: type %q op %q: not in the CRD's enums", i, p.Type, p.Operation.Op)
		}
		if p.Operation.Path == nil || p.Operation.Value == nil {
			t.Fatalf("patch %d: no path or value", i)
		}
		raw, path := p.Operation.Value.Raw, *p.Operation.Path
		switch p.Type {
		case egv1a1.ListenerEnvoyResourceType:
			if !strings.HasPrefix(p.Name, gw) || !strings.HasPrefix(path, "/default_filter_chain/filters/0/typed_config/http_filters/") {
				t.Fatalf("patch %d: listener %q path %q", i, p.Name, path)
			}
			var f hcmv3.HttpFilter
			if err := protojson.Unmarshal(raw, &f); err != nil {
				t.Fatalf("patch %d: %v", i, err)
			}
			if n := validate(t, &f, "listener patch"); n != 1 || f.Name != "envoy.filters.http.ratelimit" {
				t.Fatalf("patch %d: %s with %d typed configs", i, f.Name, n)
			}
			filter = &ratelimitv3.RateLimit{}
			if err := f.GetTypedConfig().UnmarshalTo(filter); err != nil {
				t.Fatal(err)
			}
		case egv1a1.RouteConfigurationEnvoyResourceType:
			if !strings.HasPrefix(p.Name, gw) || path != "/virtual_hosts/0/rate_limits" {
				t.Fatalf("patch %d: route configuration %q path %q", i, p.Name, path)
			}
			var list []json.RawMessage
			if err := json.Unmarshal(raw, &list); err != nil {
				t.Fatalf("patch %d: rate_limits is not a list: %v", i, err)
			}
			for _, item := range list {
				var rl routev3.RateLimit
				if err := protojson.Unmarshal(item, &rl); err != nil {
					t.Fatalf("patch %d: %v", i, err)
				}
				validate(t, &rl, "rate_limits")
				actions++
			}
		case egv1a1.ClusterEnvoyResourceType:
			// An add with an empty path is a whole new resource.
			if p.Operation.Op != "add" || path != "" {
				t.Fatalf("patch %d: cluster %s %q, want add at \"\"", i, p.Operation.Op, path)
			}
			cluster = &clusterv3.Cluster{}
			if err := protojson.Unmarshal(raw, cluster); err != nil {
				t.Fatalf("patch %d: %v", i, err)
			}
			if n := validate(t, cluster, "cluster"); n != 1 || cluster.Name != p.Name {
				t.Fatalf("patch %d: cluster %q (patch names %q) with %d typed configs", i, cluster.Name, p.Name, n)
			}
		default:
			t.Fatalf("patch %d: %s not expected", i, p.Type)
		}
	}
	if filter == nil || cluster == nil || actions == 0 {
		t.Fatalf("filter %v, cluster %v, %d rate_limits: want all three", filter != nil, cluster != nil, actions)
	}
	if got := filter.RateLimitService.GrpcService.GetEnvoyGrpc().GetClusterName(); got != cluster.Name {
		t.Fatalf("the filter calls cluster %q, the policy adds %q", got, cluster.Name)
	}
	rules, err := Parse(block(t, "# rls: rules"))
	if err != nil {
		t.Fatal(err)
	}
	if rules.domains[filter.Domain] == nil {
		t.Fatalf("the rules have no domain %q", filter.Domain)
	}
}
