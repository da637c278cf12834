/* Test guest: print one line and exit with status 42 (port protocol smoke test). */
	.code16
	.globl _start
_start:
	movw $0x3f8, %dx
	movb $'o', %al
	outb %al, %dx
	movb $'k', %al
	outb %al, %dx
	movb $'\n', %al
	outb %al, %dx
	movw $0x501, %dx
	movb $42, %al
	outb %al, %dx
	hlt
