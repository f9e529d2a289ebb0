package main

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
)

// clusterCPU counts a tree's live children and, once they are reaped, keeps their time:
// a child that exits between two samples is neither lost nor counted twice.
func TestClusterCPUCountsLiveAndReapedChildren(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	self := os.Getpid()
	before, err := clusterCPU(self)
	if err != nil {
		t.Fatal(err)
	}
	burn := exec.Command("sh", "-c", `i=0; while [ $i -lt 3000000 ]; do i=$((i+1)); done`)
	if err := burn.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	live, err := clusterCPU(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := burn.Wait(); err != nil {
		t.Fatal(err)
	}
	after, err := clusterCPU(self)
	if err != nil {
		t.Fatal(err)
	}
	child := burn.ProcessState.UserTime() + burn.ProcessState.SystemTime()
	if child < 50*time.Millisecond {
		t.Skipf("the child used only %v: too little to tell", child)
	}
	if live-before <= 0 {
		t.Errorf("while the child ran: %v more, want its time so far", live-before)
	}
	// Ticks are 10 ms; this process's own time grows meanwhile too.
	if got := after - before; got < child-20*time.Millisecond {
		t.Errorf("after the child was reaped: %v more, want at least its %v", got, child)
	}
	if own, _ := processCPU(self); own <= 0 {
		t.Errorf("processCPU(self) = %v", own)
	}
}
