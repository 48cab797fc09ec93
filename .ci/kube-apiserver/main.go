// rbak-kube-apiserver: a Kubernetes API server for the test suite, envtest-style.
//
// The upstream apiextensions server (CRDs with their schemas, CEL rules, printer
// columns, /status, server-side apply) plus plain etcd-backed REST storage for the
// built-in kinds the operator, kopf, the Helm chart and the tests use. There is no
// kubelet and no controller: nothing runs a Pod, nothing garbage-collects.
//
// Why our own main: Debian packages the apiserver libraries but not kube-apiserver,
// and the standalone apiextensions-apiserver needs a second "core" cluster, turns
// discovery off and never starts its CRD OpenAPI controllers (kubectl explain and
// kopf need both). Built by .ci/kube.sh in GOPATH mode against Debian's
// /usr/share/gocode (GO111MODULE=off, no network).
//
// Built-in kinds are stored in their v1 form; the same Go types are also
// registered as the "internal" version so the generic registry (which converts to
// an internal hub version) works without the kube-apiserver's internal types.
// Strategies are minimal: no validation or defaulting of built-in kinds; status is
// kept on main-resource writes and only the status changes on /status writes.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"reflect"
	"sort"
	"strings"
	"sync"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apiserver"
	apiextensionsoptions "k8s.io/apiextensions-apiserver/pkg/cmd/server/options"
	generatedopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/storage/names"
	"k8s.io/apiserver/pkg/util/openapi"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/validation/spec"
	netutils "k8s.io/utils/net"
)

// kind is one built-in resource we serve.
type kind struct {
	gv         schema.GroupVersion
	resource   string
	singular   string
	obj, list  runtime.Object
	namespaced bool
	status     bool
	short      []string
}

var kinds = []kind{
	{corev1.SchemeGroupVersion, "namespaces", "namespace", &corev1.Namespace{}, &corev1.NamespaceList{}, false, true, []string{"ns"}},
	{corev1.SchemeGroupVersion, "pods", "pod", &corev1.Pod{}, &corev1.PodList{}, true, true, []string{"po"}},
	{corev1.SchemeGroupVersion, "configmaps", "configmap", &corev1.ConfigMap{}, &corev1.ConfigMapList{}, true, false, []string{"cm"}},
	{corev1.SchemeGroupVersion, "secrets", "secret", &corev1.Secret{}, &corev1.SecretList{}, true, false, nil},
	{corev1.SchemeGroupVersion, "events", "event", &corev1.Event{}, &corev1.EventList{}, true, false, []string{"ev"}},
	{corev1.SchemeGroupVersion, "serviceaccounts", "serviceaccount", &corev1.ServiceAccount{}, &corev1.ServiceAccountList{}, true, false, []string{"sa"}},
	{corev1.SchemeGroupVersion, "services", "service", &corev1.Service{}, &corev1.ServiceList{}, true, true, []string{"svc"}},
	{corev1.SchemeGroupVersion, "persistentvolumeclaims", "persistentvolumeclaim", &corev1.PersistentVolumeClaim{}, &corev1.PersistentVolumeClaimList{}, true, true, []string{"pvc"}},
	{appsv1.SchemeGroupVersion, "deployments", "deployment", &appsv1.Deployment{}, &appsv1.DeploymentList{}, true, true, []string{"deploy"}},
	{batchv1.SchemeGroupVersion, "jobs", "job", &batchv1.Job{}, &batchv1.JobList{}, true, true, nil},
	{batchv1.SchemeGroupVersion, "cronjobs", "cronjob", &batchv1.CronJob{}, &batchv1.CronJobList{}, true, true, []string{"cj"}},
	{rbacv1.SchemeGroupVersion, "roles", "role", &rbacv1.Role{}, &rbacv1.RoleList{}, true, false, nil},
	{rbacv1.SchemeGroupVersion, "rolebindings", "rolebinding", &rbacv1.RoleBinding{}, &rbacv1.RoleBindingList{}, true, false, nil},
	{rbacv1.SchemeGroupVersion, "clusterroles", "clusterrole", &rbacv1.ClusterRole{}, &rbacv1.ClusterRoleList{}, false, false, nil},
	{rbacv1.SchemeGroupVersion, "clusterrolebindings", "clusterrolebinding", &rbacv1.ClusterRoleBinding{}, &rbacv1.ClusterRoleBindingList{}, false, false, nil},
	{coordinationv1.SchemeGroupVersion, "leases", "lease", &coordinationv1.Lease{}, &coordinationv1.LeaseList{}, true, false, nil},
	{eventsv1.SchemeGroupVersion, "events", "event", &eventsv1.Event{}, &eventsv1.EventList{}, true, false, []string{"ev"}},
	{policyv1.SchemeGroupVersion, "poddisruptionbudgets", "poddisruptionbudget", &policyv1.PodDisruptionBudget{}, &policyv1.PodDisruptionBudgetList{}, true, true, []string{"pdb"}},
}

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

func buildScheme() []schema.GroupVersion {
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme, rbacv1.AddToScheme,
		coordinationv1.AddToScheme, eventsv1.AddToScheme, policyv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	scheme.AddUnversionedTypes(schema.GroupVersion{Version: "v1"},
		&metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{})
	seen := map[schema.GroupVersion]bool{}
	var gvs []schema.GroupVersion
	for _, k := range kinds {
		if seen[k.gv] {
			continue
		}
		seen[k.gv] = true
		gvs = append(gvs, k.gv)
		internal := schema.GroupVersion{Group: k.gv.Group, Version: runtime.APIVersionInternal}
		for name, t := range scheme.KnownTypes(k.gv) {
			if !strings.HasPrefix(t.PkgPath(), "k8s.io/api/") {
				continue
			}
			obj := reflect.New(t).Interface().(runtime.Object)
			scheme.AddKnownTypeWithName(internal.WithKind(name), obj)
			identity := func(a, b interface{}, _ conversion.Scope) error {
				reflect.ValueOf(b).Elem().Set(reflect.ValueOf(a).Elem())
				return nil
			}
			if err := scheme.AddConversionFunc(obj, reflect.New(t).Interface(), identity); err != nil {
				panic(err)
			}
		}
	}
	return gvs
}

// strategy: namespaced or not, status kept apart when the kind has one.
type strategy struct {
	runtime.ObjectTyper
	names.NameGenerator
	namespaced, status bool
}

func (s strategy) NamespaceScoped() bool { return s.namespaced }

func fieldOf(obj runtime.Object, name string) reflect.Value {
	return reflect.ValueOf(obj).Elem().FieldByName(name)
}

func (s strategy) PrepareForCreate(ctx context.Context, obj runtime.Object) {
	if s.status {
		st := fieldOf(obj, "Status")
		st.Set(reflect.Zero(st.Type()))
	}
	if m, ok := obj.(metav1.Object); ok {
		m.SetGeneration(1)
	}
}

func (s strategy) PrepareForUpdate(ctx context.Context, obj, old runtime.Object) {
	if s.status {
		fieldOf(obj, "Status").Set(fieldOf(old, "Status"))
	}
	m, mo := obj.(metav1.Object), old.(metav1.Object)
	m.SetGeneration(mo.GetGeneration())
	if sp := fieldOf(obj, "Spec"); sp.IsValid() && !equality.Semantic.DeepEqual(sp.Interface(), fieldOf(old, "Spec").Interface()) {
		m.SetGeneration(mo.GetGeneration() + 1)
	}
}

func (strategy) Validate(ctx context.Context, obj runtime.Object) field.ErrorList { return nil }
func (strategy) WarningsOnCreate(ctx context.Context, obj runtime.Object) []string {
	return nil
}
func (strategy) Canonicalize(obj runtime.Object)   {}
func (strategy) AllowCreateOnUpdate() bool         { return false }
func (strategy) AllowUnconditionalUpdate() bool    { return true }
func (strategy) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	return nil
}
func (strategy) WarningsOnUpdate(ctx context.Context, obj, old runtime.Object) []string {
	return nil
}

// statusStrategy: a /status write changes the status only.
type statusStrategy struct{ strategy }

func (statusStrategy) PrepareForUpdate(ctx context.Context, obj, old runtime.Object) {
	st := fieldOf(obj, "Status").Interface()
	reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(old.DeepCopyObject()).Elem())
	fieldOf(obj, "Status").Set(reflect.ValueOf(st))
}

// statusREST is the /status subresource, as kube-apiserver's registries do it.
type statusREST struct{ store *genericregistry.Store }

func (r *statusREST) New() runtime.Object { return r.store.New() }
func (r *statusREST) Destroy()            {}
func (r *statusREST) Get(ctx context.Context, name string, options *metav1.GetOptions) (runtime.Object, error) {
	return r.store.Get(ctx, name, options)
}
func (r *statusREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc,
	updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return r.store.Update(ctx, name, objInfo, createValidation, updateValidation, false, options)
}
func (r *statusREST) ConvertToTable(ctx context.Context, object runtime.Object, tableOptions runtime.Object) (*metav1.Table, error) {
	return r.store.ConvertToTable(ctx, object, tableOptions)
}

// storeREST adds short names to the generic store (kubectl get ns, cm, ...).
type storeREST struct {
	*genericregistry.Store
	short []string
}

func (r *storeREST) ShortNames() []string { return r.short }

func newStores(getter generic.RESTOptionsGetter, k kind) (rest.Storage, rest.Storage, error) {
	s := strategy{scheme, names.SimpleNameGenerator, k.namespaced, k.status}
	obj, list := k.obj, k.list
	gr := k.gv.WithResource(k.resource).GroupResource()
	store := &genericregistry.Store{
		NewFunc:                   func() runtime.Object { return obj.DeepCopyObject() },
		NewListFunc:               func() runtime.Object { return list.DeepCopyObject() },
		DefaultQualifiedResource:  gr,
		SingularQualifiedResource: k.gv.WithResource(k.singular).GroupResource(),
		CreateStrategy:            s,
		UpdateStrategy:            s,
		DeleteStrategy:            s,
		TableConvertor:            rest.NewDefaultTableConvertor(gr),
	}
	if err := store.CompleteWithOptions(&generic.StoreOptions{RESTOptions: getter}); err != nil {
		return nil, nil, err
	}
	if !k.status {
		return &storeREST{store, k.short}, nil, nil
	}
	st := *store
	st.UpdateStrategy = statusStrategy{s}
	return &storeREST{store, k.short}, &statusREST{&st}, nil
}

// builtinDefinitions: OpenAPI models for the built-in kinds. The generated ones live in
// k8s.io/kubernetes, which Debian does not package; server-side apply only needs
// apiVersion/kind/metadata typed, the rest is kept as given (as for a CRD with
// x-kubernetes-preserve-unknown-fields).
func builtinDefinitions(ref common.ReferenceCallback) map[string]common.OpenAPIDefinition {
	defs := generatedopenapi.GetOpenAPIDefinitions(ref)
	str := spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"string"}}}
	objectMeta := metav1.ObjectMeta{}.OpenAPIModelName()
	listMeta := metav1.ListMeta{}.OpenAPIModelName()
	for _, k := range kinds {
		for _, o := range []runtime.Object{k.obj, k.list} {
			meta, isList := objectMeta, o == k.list
			props := map[string]spec.Schema{"apiVersion": str, "kind": str}
			if isList {
				meta = listMeta
				props["items"] = spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"array"},
					Items: &spec.SchemaOrArray{Schema: &spec.Schema{SchemaProps: spec.SchemaProps{
						Ref: ref(openapiName(k.obj))}}}}}
			}
			props["metadata"] = spec.Schema{SchemaProps: spec.SchemaProps{Default: map[string]interface{}{}, Ref: ref(meta)}}
			deps := []string{meta}
			if isList {
				deps = append(deps, openapiName(k.obj))
			}
			defs[openapiName(o)] = common.OpenAPIDefinition{
				Schema: spec.Schema{
					SchemaProps:      spec.SchemaProps{Type: []string{"object"}, Properties: props},
					// a map of its own: the OpenAPI builder adds each type's GVK extension into it
					VendorExtensible: spec.VendorExtensible{Extensions: spec.Extensions{"x-kubernetes-preserve-unknown-fields": true}},
				},
				Dependencies: deps,
			}
		}
	}
	return defs
}

func openapiName(o runtime.Object) string {
	return reflect.ValueOf(o).MethodByName("OpenAPIModelName").Call(nil)[0].String()
}

// crdDiscovery lists the CRD groups in the unaggregated /apis (kopf reads that one);
// the aggregated one is kept by the apiextensions server's own discovery controller.
type crdDiscovery struct {
	mu     sync.Mutex
	server *genericapiserver.GenericAPIServer
	groups map[string]bool
}

func (d *crdDiscovery) sync(lister func() []*apiextensionsv1.CustomResourceDefinition) {
	d.mu.Lock()
	defer d.mu.Unlock()
	versions := map[string][]apiextensionsv1.CustomResourceDefinitionVersion{}
	for _, crd := range lister() {
		established := false
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				established = true
			}
		}
		if !established {
			continue
		}
		for _, v := range crd.Spec.Versions {
			if v.Served {
				versions[crd.Spec.Group] = append(versions[crd.Spec.Group], v)
			}
		}
	}
	for g := range d.groups {
		if _, ok := versions[g]; !ok {
			d.server.DiscoveryGroupManager.RemoveGroup(g)
			delete(d.groups, g)
		}
	}
	for g, vs := range versions {
		seen := map[string]bool{}
		var names []string
		for _, v := range vs {
			if !seen[v.Name] {
				seen[v.Name] = true
				names = append(names, v.Name)
			}
		}
		sort.Slice(names, func(i, j int) bool { return versionLess(names[j], names[i]) })
		group := metav1.APIGroup{Name: g}
		for _, n := range names {
			group.Versions = append(group.Versions, metav1.GroupVersionForDiscovery{GroupVersion: g + "/" + n, Version: n})
		}
		group.PreferredVersion = group.Versions[0]
		d.server.DiscoveryGroupManager.AddGroup(group)
		d.groups[g] = true
	}
}

// versionLess orders Kubernetes versions: v1 > v1beta1 > v1alpha1.
func versionLess(a, b string) bool {
	rank := func(v string) (int, int, int) {
		var major, minor int
		level := 3
		switch {
		case strings.Contains(v, "alpha"):
			level = 1
			fmt.Sscanf(v, "v%dalpha%d", &major, &minor)
		case strings.Contains(v, "beta"):
			level = 2
			fmt.Sscanf(v, "v%dbeta%d", &major, &minor)
		default:
			fmt.Sscanf(v, "v%d", &major)
		}
		return level, major, minor
	}
	la, ma, na := rank(a)
	lb, mb, nb := rank(b)
	if la != lb {
		return la < lb
	}
	if ma != mb {
		return ma < mb
	}
	return na < nb
}

func main() {
	var etcd, bind, certDir, tokenFile, auditLog, auditPolicy string
	var port int
	flag.StringVar(&etcd, "etcd-servers", "http://127.0.0.1:2379", "etcd client URL")
	flag.StringVar(&bind, "bind-address", "127.0.0.1", "address to listen on")
	flag.IntVar(&port, "secure-port", 6443, "HTTPS port")
	flag.StringVar(&certDir, "cert-dir", "", "where the self-signed serving certificate is written (apiserver.crt, apiserver.key)")
	flag.StringVar(&tokenFile, "token-file", "", "file holding the one bearer token accepted (user admin, group system:masters)")
	flag.StringVar(&auditLog, "audit-log-path", "", "write audit events (JSON lines) here: which client made which call")
	flag.StringVar(&auditPolicy, "audit-policy-file", "", "audit policy (needed with --audit-log-path)")
	klogFlags := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(klogFlags)
	flag.Parse()
	_ = klogFlags.Set("v", "1")
	if err := run(etcd, bind, port, certDir, tokenFile, auditLog, auditPolicy); err != nil {
		fmt.Fprintln(os.Stderr, "rbak-kube-apiserver:", err)
		os.Exit(1)
	}
}

func run(etcd, bind string, port int, certDir, tokenFile, auditLog, auditPolicy string) error {
	gvs := buildScheme()
	tokenBytes, err := os.ReadFile(tokenFile)
	if err != nil {
		return fmt.Errorf("--token-file: %w", err)
	}
	token := strings.TrimSpace(string(tokenBytes))

	o := apiextensionsoptions.NewCustomResourceDefinitionsServerOptions(os.Stdout, os.Stderr)
	ro := o.RecommendedOptions
	ro.Etcd.StorageConfig.Transport.ServerList = []string{etcd}
	ro.SecureServing.BindAddress = netutils.ParseIPSloppy(bind)
	ro.SecureServing.BindPort = port
	ro.SecureServing.ServerCert.CertDirectory = certDir
	ro.Authentication = nil
	ro.Authorization = nil
	ro.CoreAPI = nil
	ro.Admission = nil
	ro.Features.EnablePriorityAndFairness = false
	ro.Audit.LogOptions.Path = auditLog
	ro.Audit.PolicyFile = auditPolicy
	if err := ro.SecureServing.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{netutils.ParseIPSloppy("127.0.0.1")}); err != nil {
		return err
	}
	serverConfig := genericapiserver.NewRecommendedConfig(apiserver.Codecs)
	if err := o.ServerRunOptions.ApplyTo(&serverConfig.Config); err != nil {
		return err
	}
	if err := ro.ApplyTo(serverConfig); err != nil {
		return err
	}
	if err := o.APIEnablement.ApplyTo(&serverConfig.Config, apiserver.DefaultAPIResourceConfigSource(), apiserver.Scheme); err != nil {
		return err
	}
	serverConfig.Authentication.Authenticator = bearertoken.New(authenticator.TokenFunc(
		func(ctx context.Context, t string) (*authenticator.Response, bool, error) {
			if t != token {
				return nil, false, nil
			}
			return &authenticator.Response{User: &user.DefaultInfo{
				Name: "admin", Groups: []string{user.SystemPrivilegedGroup, user.AllAuthenticated}}}, true, nil
		}))
	serverConfig.Authorization.Authorizer = authorizerfactory.NewAlwaysAllowAuthorizer()
	serverConfig.AdmissionControl = admission.NewChainHandler()
	namer := openapinamer.NewDefinitionNamer(apiserver.Scheme, scheme)
	defs := openapi.GetOpenAPIDefinitionsWithoutDisabledFeatures(builtinDefinitions)
	serverConfig.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(defs, namer)
	serverConfig.OpenAPIConfig.Info.Title = "rbak-kube-apiserver"
	serverConfig.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(defs, namer)
	serverConfig.OpenAPIV3Config.Info.Title = "rbak-kube-apiserver"

	config := &apiserver.Config{
		GenericConfig: serverConfig,
		ExtraConfig: apiserver.ExtraConfig{
			CRDRESTOptionsGetter: apiextensionsoptions.NewCRDRESTOptionsGetter(*ro.Etcd, serverConfig.ResourceTransformers, serverConfig.StorageObjectCountTracker),
		},
	}
	completed := config.Complete()
	// apiextensions turns discovery off (kube-apiserver's aggregator serves it); we have none.
	completed.GenericConfig.EnableDiscovery = true
	server, err := completed.New(genericapiserver.NewEmptyDelegate())
	if err != nil {
		return err
	}

	// Built-in kinds: their own codec (stored as v1 JSON) over the same etcd.
	etcdOpts := *ro.Etcd
	etcdOpts.StorageConfig.Codec = codecs.LegacyCodec(gvs...)
	etcdOpts.StorageConfig.Prefix = "/registry"
	etcdOpts.WatchCacheSizes = nil
	getter := etcdOpts.CreateRESTOptionsGetter(&genericoptions.SimpleStorageFactory{StorageConfig: etcdOpts.StorageConfig}, serverConfig.ResourceTransformers)
	groups := map[string]*genericapiserver.APIGroupInfo{}
	var order []string
	for _, k := range kinds {
		info, ok := groups[k.gv.Group]
		if !ok {
			i := genericapiserver.NewDefaultAPIGroupInfo(k.gv.Group, scheme, runtime.NewParameterCodec(scheme), codecs)
			info = &i
			groups[k.gv.Group] = info
			order = append(order, k.gv.Group)
		}
		mainStore, status, err := newStores(getter, k)
		if err != nil {
			return err
		}
		m := info.VersionedResourcesStorageMap[k.gv.Version]
		if m == nil {
			m = map[string]rest.Storage{}
			info.VersionedResourcesStorageMap[k.gv.Version] = m
		}
		m[k.resource] = mainStore
		if status != nil {
			m[k.resource+"/status"] = status
		}
	}
	g := server.GenericAPIServer
	if err := g.InstallLegacyAPIGroup(genericapiserver.DefaultLegacyAPIPrefix, groups[""]); err != nil {
		return err
	}
	var named []*genericapiserver.APIGroupInfo
	for _, name := range order {
		if name != "" {
			named = append(named, groups[name])
		}
	}
	if err := g.InstallAPIGroups(named...); err != nil {
		return err
	}

	disc := &crdDiscovery{server: g, groups: map[string]bool{}}
	informer := server.Informers.Apiextensions().V1().CustomResourceDefinitions()
	list := func() []*apiextensionsv1.CustomResourceDefinition {
		crds, _ := informer.Lister().List(labels.Everything())
		return crds
	}
	_, _ = informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(interface{}) { disc.sync(list) },
		UpdateFunc: func(interface{}, interface{}) { disc.sync(list) },
		DeleteFunc: func(interface{}) { disc.sync(list) },
	})

	ctx := genericapiserver.SetupSignalContext()
	return g.PrepareRun().RunWithContext(ctx)
}
