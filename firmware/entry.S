/*
 * gpupass guest firmware: entry.
 *
 * The VMM loads the flat binary at FW_LOAD (0x1000) and starts the vCPU in
 * 16-bit real mode with CS = 0, IP = 0x1000 (a reset-like state). We load our
 * own flat GDT, set CR0.PE and jump to 32-bit protected mode (no paging), so
 * the C code can reach BARs anywhere below 4 GiB. Real mode -> protected mode
 * by the guest itself is what works on kvm_pvm (see docs/vmm.md).
 */
#define FW_STACK_TOP 0x90000

	.section .text.entry, "ax"
	.code16
	.globl _start
_start:
	cli
	cld
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
	movw %ax, %es
	movw %ax, %fs
	movw %ax, %gs
	movw %ax, %ss
	movl $FW_STACK_TOP, %esp
	/* Zero .bss (a flat binary does not carry it). */
	movl $__bss_start, %edi
	movl $__bss_end, %ecx
	subl %edi, %ecx
	xorl %eax, %eax
	rep stosb
	call fw_main
	/* fw_main returns the exit status in %al: report it on the exit port. */
	movw $0x501, %dx
	outb %al, %dx
1:	hlt
	jmp 1b

	/* Kept in .text.entry: real mode reaches it with DS = 0 (below 64 KiB). */
	.align 8
gdt:
	.quad 0                        /* null */
	.quad 0x00cf9a000000ffff       /* 0x08: code, base 0, limit 4 GiB, 32-bit */
	.quad 0x00cf92000000ffff       /* 0x10: data, base 0, limit 4 GiB */
gdt_end:
gdt_desc:
	.word gdt_end - gdt - 1
	.long gdt
