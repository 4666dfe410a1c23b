package plan_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/plan"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// controlPlane is a Kubernetes control-plane node shaped like k8s-snap's:
// the datastore first, kube-apiserver once the datastore accepts
// connections, the controllers and kubelet once the apiserver's /readyz
// answers, and (as on a worker) kubelet also after containerd.
// containerd is Type=notify, so snapd's start change only ends once it
// has signalled readiness: it needs no probe.
func controlPlane(etcdAddr, apiserverURL string) []plan.Service {
	apiserver := "k8s.kube-apiserver"
	return []plan.Service{
		{Name: "k8s.containerd"},
		{Name: "k8s.etcd", Probe: probe.TCP{Address: etcdAddr}},
		{Name: apiserver, After: []string{"k8s.etcd"}, Probe: &probe.HTTP{URL: apiserverURL + "/readyz"}},
		{Name: "k8s.kube-controller-manager", After: []string{apiserver}},
		{Name: "k8s.kube-scheduler", After: []string{apiserver}},
		{Name: "k8s.kubelet", After: []string{"k8s.containerd", apiserver}},
		{Name: "k8s.kube-proxy", After: []string{apiserver}},
	}
}

// Start a Kubernetes control plane against a fake snapd: services start
// in three changes, each gated on the readiness of what it needs, and a
// controller waits for the plan's ready signal.
func Example_controlPlane() {
	// AllowNonRoot: examples run as you, and snapd lets only root start,
	// stop and restart services.
	srv, _ := fake.New(fake.AllowNonRoot(), fake.WithSnaps(k8sSnap()))
	defer srv.Close()
	client, _ := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST))
	defer client.Close()

	// The datastore's client port and the apiserver's /readyz, which
	// answers only once snapd reports kube-apiserver active.
	etcd, _ := net.Listen("tcp", "127.0.0.1:0")
	defer etcd.Close()
	go func() {
		for {
			c, err := etcd.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if st, _ := srv.Service("k8s", "kube-apiserver"); !st.Active {
			http.Error(w, "[-]etcd failed", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	defer api.Close()

	p, err := plan.New(controlPlane(etcd.Addr().String(), api.URL), plan.Options{
		Enable: true,
		Probe:  probe.Options{Interval: 100 * time.Millisecond, MaxWait: time.Minute},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go p.Start(ctx, client)

	// A controller gates on the ready signal.
	if err := p.WaitReady(ctx); err != nil {
		fmt.Println(err)
		return
	}
	<-p.Done() // Start has returned; nothing of the plan runs any more
	for i, b := range p.Batches() {
		fmt.Printf("change %d: %s\n", i+1, strings.Join(b.Services, " "))
	}
	fmt.Println("control plane ready")
	// Output:
	// change 1: k8s.containerd k8s.etcd
	// change 2: k8s.kube-apiserver
	// change 3: k8s.kube-controller-manager k8s.kube-scheduler k8s.kubelet k8s.kube-proxy
	// control plane ready
}

// A worker node: kubelet starts once containerd's socket accepts
// connections.
func Example_worker() {
	// AllowNonRoot: examples run as you, and snapd lets only root start,
	// stop and restart services.
	srv, _ := fake.New(fake.AllowNonRoot(), fake.WithSnaps(k8sSnap()))
	defer srv.Close()
	client, _ := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST))
	defer client.Close()

	// Stands in for /run/containerd/containerd.sock.
	sock := filepath.Join(srv.Dir(), "containerd.sock")
	ln, _ := net.Listen("unix", sock)
	defer ln.Close()

	p, _ := plan.New([]plan.Service{
		{Name: "k8s.containerd", Probe: probe.Unix{Path: sock}},
		{Name: "k8s.kubelet", After: []string{"k8s.containerd"}},
	}, plan.Options{Enable: true, Probe: probe.Options{Interval: 100 * time.Millisecond, MaxWait: time.Minute}})
	if err := p.Start(context.Background(), client); err != nil {
		fmt.Println(err)
		return
	}
	for i, b := range p.Batches() {
		fmt.Printf("change %d: %s\n", i+1, strings.Join(b.Services, " "))
	}
	// Output:
	// change 1: k8s.containerd
	// change 2: k8s.kubelet
}
