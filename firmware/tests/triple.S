/* Test guest: enter 32-bit protected mode with an empty IDT and raise int3. The
 * #GP for the missing gate cannot be delivered either: a triple fault, which
 * KVM reports as KVM_EXIT_SHUTDOWN. Loaded at 0x1000 like the firmware. */
	.code16
	.globl _start
_start:
	cli
	xorw %ax, %ax
	movw %ax, %ds
	lgdtl gdt_desc
	movl %cr0, %eax
	orl $1, %eax
	movl %eax, %cr0
	ljmpl $0x08, $pm32
	.code32
pm32:
	movw $0x10, %ax
	movw %ax, %ds
	movw %ax, %ss
	lidt idt_desc
	int3
	hlt
	.align 8
gdt:
	.quad 0
	.quad 0x00cf9a000000ffff
	.quad 0x00cf92000000ffff
gdt_desc:
	.word 23
	.long gdt
idt_desc:
	.word 0
	.long 0
