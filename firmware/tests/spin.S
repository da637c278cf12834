/* Test guest: spin forever in real mode (for the timeout path). */
	.code16
	.globl _start
_start:
1:	jmp 1b
