package etcdbudget_test

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// A maintenance window that runs past midnight, in the cluster's time
// zone: outside it a Controlled budget's Acquire waits.
func ExampleParseWindow() {
	w, err := etcdbudget.ParseWindow("Mon-Fri 22:00-04:00 Europe/Berlin")
	if err != nil {
		fmt.Println(err)
		return
	}
	berlin, _ := time.LoadLocation("Europe/Berlin")
	sat := time.Date(2026, 12, 5, 3, 30, 0, 0, berlin) // Saturday 03:30: Friday's window
	fmt.Println(w, w.Contains(sat))
	fmt.Println("next opening:", w.Next(sat.Add(time.Hour)).Format("Mon 2006-01-02 15:04 MST"))
	// Output:
	// Mon,Tue,Wed,Thu,Fri 22:00-04:00 Europe/Berlin true
	// next opening: Mon 2026-12-07 22:00 CET
}

// Max-unavailable as a share of the machines taking part: rounded down,
// but at least one.
func ExampleMaxUnavailable_Of() {
	m, _ := etcdbudget.ParseMaxUnavailable("25%")
	for _, machines := range []int{3, 8, 10} {
		fmt.Printf("%s of %d machines: %d at a time\n", m, machines, m.Of(machines))
	}
	// Output:
	// 25% of 3 machines: 1 at a time
	// 25% of 8 machines: 2 at a time
	// 25% of 10 machines: 2 at a time
}

// A controller's rolling restart with the operator controls: at most a
// quarter of the machines taking part at once, only at night on
// weekdays, with metrics for an exporter. (Not run: it needs etcd.)
func ExampleNewControlled() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"https://10.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		return
	}
	defer cli.Close()
	window, _ := etcdbudget.ParseWindow("Mon-Fri 22:00-04:00 Europe/Berlin")
	quarter, _ := etcdbudget.ParseMaxUnavailable("25%")
	b, err := etcdbudget.NewControlled(etcdbudget.Config{Client: cli, TTL: 10 * time.Second},
		etcdbudget.Controls{Window: window, MaxUnavailable: quarter, OnEvent: func(ev etcdbudget.Event) {
			fmt.Println(ev.Kind, ev.Key, ev.Held)
		}})
	if err != nil {
		return
	}
	defer b.Close()
	c, err := snapsvc.New(snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{Settle: 5 * time.Second}))
	if err != nil {
		return
	}
	defer c.Close()
	if _, err := c.Restart(context.Background(), []string{"k8s.kube-apiserver"}, snapsvc.RestartOptions{}); err != nil {
		fmt.Println(err)
	}
	m := b.Metrics()
	fmt.Println("held", m.Holding, "waiting", m.Waiting, "lost", m.Lost, "hold seconds", m.HoldSeconds)
}
