/* Test guest: halt without reporting a status. */
	.code16
	.globl _start
_start:
	cli
	hlt
