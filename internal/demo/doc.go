// Package demo holds the check the example programs' tests share: that the
// printed table tells the quick-start story to its end. The examples
// themselves use public API only, so a reader can copy them.
package demo
