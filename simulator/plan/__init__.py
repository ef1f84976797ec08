"""simulator/plan"""
