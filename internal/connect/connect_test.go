package connect

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Redis that accepts connections and never answers (a SIGSTOPped server) costs a command
// CallTimeout, retries included, when the caller set no deadline, and the caller's deadline
// when that is sooner; a server that answers is unaffected.
func TestRedisCallsAreBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held <- c // accepted, never read from nor answered
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for len(held) > 0 {
			(<-held).Close()
		}
	})
	rdb, err := Redis("redis://" + ln.Addr().String() + "/0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })

	start := time.Now()
	err = rdb.Ping(context.Background()).Err()
	took := time.Since(start)
	t.Logf("PING to a silent server without a deadline: %v after %v", err, took)
	if err == nil || took > CallTimeout+300*time.Millisecond {
		t.Fatalf("PING without a deadline: %v after %v, want an error within %v", err, took, CallTimeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start = time.Now()
	err = rdb.Eval(ctx, "return 1", nil).Err()
	took = time.Since(start)
	if err == nil || took > 500*time.Millisecond {
		t.Fatalf("EVAL with a 200ms deadline: %v after %v", err, took)
	}
	start = time.Now()
	_, err = rdb.Pipelined(context.Background(), func(p redis.Pipeliner) error {
		p.Ping(context.Background())
		p.Ping(context.Background())
		return nil
	})
	took = time.Since(start)
	if err == nil || took > CallTimeout+300*time.Millisecond {
		t.Fatalf("pipeline without a deadline: %v after %v, want an error within %v", err, took, CallTimeout)
	}
}
